"""Step time (median over repeats after warm-up) and the allocator-level peak of an executed plan."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainplan.execute.runner import RunResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageTimes:
    """Wall time of each stage's events in every timed repetition (s) and their median."""

    runs: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.runs)


def time_runs(run: Callable[[], RunResult], n_stages: int, *, repeats: int, warmup: int) -> list[StageTimes]:
    """Execute ``run`` ``warmup + repeats`` times; per stage, the summed wall time of its events per run."""
    per_stage: list[list[float]] = [[] for _ in range(n_stages)]
    for i in range(warmup + repeats):
        result = run()
        if i < warmup:
            continue
        totals = [0.0] * n_stages
        for rec in result.records:
            totals[rec.stage] += rec.seconds
        for s, t in enumerate(totals):
            per_stage[s].append(t)
        del result
    return [StageTimes(runs) for runs in per_stage]


def _cpu_allocator_peak(run: Callable[[], RunResult]) -> int | None:
    """Largest running total of CPU allocator bytes during ``run`` (profiler memory events), above the start."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = run()
        del result
    try:
        stack = list(prof.profiler.kineto_results.experimental_event_tree())
    except AttributeError:  # private API moved: say so rather than guess
        log.warning("profiler event tree unavailable: no allocator-level cross-check")
        return None
    peak = 0
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        total = getattr(node.extra_fields, "total_allocated", None)
        if total is not None:
            peak = max(peak, int(total))
    return peak


def allocator_peak(run: Callable[[], RunResult], device: torch.device, start_bytes: int) -> int | None:
    """Allocator-level peak bytes of one run: ``torch.cuda.max_memory_allocated`` on CUDA; on CPU the bytes
    held at the start (``start_bytes``) plus the profiler's largest running total of allocations."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = run()
        del result
        return int(torch.cuda.max_memory_allocated(device))
    extra = _cpu_allocator_peak(run)
    return None if extra is None else start_bytes + extra
