"""Clocks for timing ops on any device: a wall clock that waits for a GPU's queued work, and the median time
per call of back-to-back runs (GC paused, as ``trainplan.timing`` arranges)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from trainplan.timing import gc_paused


def synced_clock(device: torch.device | str) -> Callable[[], float]:
    """``time.perf_counter``, read on a CUDA ``device`` only after the device's queued work has finished (its
    kernels run asynchronously: an unsynchronised read times their launch, not their work)."""
    if torch.device(device).type == "cuda":
        def synced() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return synced
    return time.perf_counter


def median_seconds(fn: Callable[[], object], now: Callable[[], float], repeats: int, warmup: int, calls: int = 1) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` runs of ``calls`` back-to-back calls each (a run's time
    over its calls), after ``warmup`` calls; clock ``now``; GC paused throughout."""
    with gc_paused():
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            start = now()
            for _ in range(calls):
                fn()
            times.append((now() - start) / calls)
    return statistics.median(times)
