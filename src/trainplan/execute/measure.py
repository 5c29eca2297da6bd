"""Step time of a compiled plan (median over repeats after warm-up) and the allocator-level peak of a run."""

from __future__ import annotations

import logging
import resource
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainplan.execute.compile import Clock
from trainplan.timing import gc_paused, live_objects_frozen

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timings:
    """Per stage, the wall time of its own events (compiled, ``execute.compile``) in every timed repetition
    (s), for the plan and for the no-recompute baseline run alternately with it (same machine load), and the
    time of its communication (sending and receiving storages between stages, which no plan models)."""

    stage_runs: list[list[float]]
    baseline_runs: list[list[float]]
    communication_runs: list[list[float]]
    page_faults: list[int]  # minor page faults of the process during each timed plan run
    baseline_page_faults: list[int]  # and during each no-recompute run

    def communication_median(self, stage: int) -> float:
        return statistics.median(self.communication_runs[stage])


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_runs(run: Callable[[], Clock], baseline: Callable[[], Clock], n_stages: int, *, repeats: int,
              warmup: int) -> Timings:
    """Execute ``run`` and ``baseline`` alternately ``warmup + repeats`` times (``repeats`` >= 1), each with the
    cyclic GC paused after a collection (of what was allocated since the first run: ``live_objects_frozen``),
    counting the minor page faults of each: memory the process touches for the first time (or again, after it
    went back to the system) costs a fault per page, which op times measured elsewhere may not include."""
    faults: list[int] = []
    base_faults: list[int] = []
    stage_runs: list[list[float]] = [[] for _ in range(n_stages)]
    baseline_runs: list[list[float]] = [[] for _ in range(n_stages)]
    communication_runs: list[list[float]] = [[] for _ in range(n_stages)]
    with live_objects_frozen():  # the model's and torch's objects out of each collection
        for i in range(warmup + repeats):
            with gc_paused():
                f0 = _minor_faults()
                clock = run()
                f1 = _minor_faults()
            with gc_paused():
                base = baseline()
                f2 = _minor_faults()
            if i < warmup:
                continue
            faults.append(f1 - f0)
            base_faults.append(f2 - f1)
            for s in range(n_stages):
                stage_runs[s].append(clock.stage_seconds(s))
                baseline_runs[s].append(base.stage_seconds(s))
                communication_runs[s].append(clock.stage_seconds(s, communication=True))
    return Timings(stage_runs, baseline_runs, communication_runs, faults, base_faults)


def peak_during(run: Callable[[], Any], device: torch.device) -> tuple[Any, int | None]:
    """``run()``'s result and the most it allocated on top of what was allocated before it:
    ``torch.cuda.max_memory_allocated`` less ``memory_allocated`` before on CUDA, the largest running total of
    the profiler's memory events on the CPU (None if the profiler's event tree is unavailable)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        out = run()
        torch.cuda.synchronize(device)
        return out, int(torch.cuda.max_memory_allocated(device)) - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = run()
    try:
        stack = list(prof.profiler.kineto_results.experimental_event_tree())
    except AttributeError:  # private API moved: say so rather than guess
        log.warning("profiler event tree unavailable: no allocator-level peak")
        return out, None
    events = []  # (time, bytes allocated (< 0: freed), allocator total after it)
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        total = getattr(node.extra_fields, "total_allocated", None)
        if total is not None:
            events.append((node.start_time_ns, int(node.extra_fields.alloc_size), int(total)))
    if not events:
        return out, 0
    events.sort()
    before = events[0][2] - events[0][1]  # the allocator's total is process-wide: count from the run's start
    return out, max(total for *_, total in events) - before


def allocator_peak(run: Callable[[], Any], device: torch.device, start_bytes: int) -> int | None:
    """Allocator-level peak bytes of one run: the bytes held at the start (``start_bytes``) plus the most the
    run allocated on top of what was allocated before it (:func:`peak_during`; its outputs are released on
    return, after the peak counted them)."""
    extra = peak_during(run, device)[1]
    return None if extra is None else start_bytes + extra
