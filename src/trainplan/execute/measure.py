"""Step time (median over repeats after warm-up) and the allocator-level peak of an executed plan."""

from __future__ import annotations

import logging
import resource
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainplan.execute.runner import RunResult
from trainplan.timing import gc_paused

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timings:
    """Per stage, the summed wall time of its compute, free and swap events in every timed repetition (s),
    for the plan and for the no-recompute baseline run alternately with it (same machine load); the time of
    its events on storages received from other stages (communication, which no plan models); per plan
    event, the median."""

    stage_runs: list[list[float]]
    baseline_runs: list[list[float]]
    communication_runs: list[list[float]]
    event_median_s: list[float]  # in the run's event order
    page_faults: list[int]  # minor page faults of the process during each timed plan run
    baseline_page_faults: list[int]  # and during each no-recompute run

    def communication_median(self, stage: int) -> float:
        return statistics.median(self.communication_runs[stage])


def _stage_totals(result: RunResult, n_stages: int, boundary: bool = False) -> list[float]:
    """Per stage, the summed seconds of its events on its own storages (or, with ``boundary``, on received ones)."""
    totals = [0.0] * n_stages
    for rec in result.records:
        if rec.boundary == boundary:
            totals[rec.stage] += rec.seconds
    return totals


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_runs(run: Callable[[], RunResult], baseline: Callable[[], RunResult], n_stages: int, *, repeats: int,
              warmup: int) -> Timings:
    """Execute ``run`` and ``baseline`` alternately ``warmup + repeats`` times (``repeats`` >= 1), each with the
    cyclic GC paused after a collection, counting the minor page faults of each: memory the process touches
    for the first time (or again, after it went back to the system) costs a fault per page, which op times
    measured elsewhere may not include."""
    faults: list[int] = []
    base_faults: list[int] = []
    stage_runs: list[list[float]] = [[] for _ in range(n_stages)]
    baseline_runs: list[list[float]] = [[] for _ in range(n_stages)]
    communication_runs: list[list[float]] = [[] for _ in range(n_stages)]
    per_event: list[list[float]] = []
    for i in range(warmup + repeats):
        with gc_paused():
            f0 = _minor_faults()
            result = run()
            f1 = _minor_faults()
        with gc_paused():
            base = _stage_totals(baseline(), n_stages)
            f2 = _minor_faults()
        if i < warmup:
            continue
        faults.append(f1 - f0)
        base_faults.append(f2 - f1)
        for j, rec in enumerate(result.records):
            if j == len(per_event):
                per_event.append([])
            per_event[j].append(rec.seconds)
        comm = _stage_totals(result, n_stages, boundary=True)
        for s, (t, b) in enumerate(zip(_stage_totals(result, n_stages), base)):
            stage_runs[s].append(t)
            baseline_runs[s].append(b)
            communication_runs[s].append(comm[s])
        del result
    return Timings(stage_runs, baseline_runs, communication_runs, [statistics.median(x) for x in per_event],
                   faults, base_faults)


def _cpu_allocator_peak(run: Callable[[], RunResult]) -> int | None:
    """Largest running total of CPU allocator bytes during ``run`` (profiler memory events), above the start."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()  # its outputs are released on return, after the peak counted them
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
    """Allocator-level peak bytes of one run: the bytes held at the start (``start_bytes``) plus the most the
    run allocated on top of what was allocated before it: ``torch.cuda.max_memory_allocated`` on CUDA (less
    ``memory_allocated`` before, which holds references and earlier results too), the profiler's largest
    running total of allocations on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        run()  # its outputs are released on return, after the peak counted them
        return start_bytes + int(torch.cuda.max_memory_allocated(device)) - before
    extra = _cpu_allocator_peak(run)
    return None if extra is None else start_bytes + extra
