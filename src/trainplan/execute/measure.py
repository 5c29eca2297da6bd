"""Step time of a compiled plan (median over repeats after warm-up) and the peak bytes of a run at two levels:
torch's allocator, and what the process holds (the CPU) or the pinned host bytes (CUDA)."""

from __future__ import annotations

import ctypes
import gc
import resource
import statistics
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch

from trainplan.execute.compile import Clock
from trainplan.memory_model import MemoryModel
from trainplan.profiler_events import event_roots, memory_profile
from trainplan.timing import gc_paused, live_objects_frozen


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


def minor_faults() -> int:
    """Minor page faults of this process so far (pages it mapped anew)."""
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
                f0 = minor_faults()
                clock = run()
                f1 = minor_faults()
            with gc_paused():
                base = baseline()
                f2 = minor_faults()
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
    with memory_profile() as prof:
        out = run()
    stack = event_roots(prof, "no allocator-level peak")
    if stack is None:
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


def _status_bytes(key: str) -> int:
    """A memory line of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), in bytes."""
    line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith(f"{key}:"))
    return int(line.split()[1]) * 1024


@cache
def _meter_thread() -> ThreadPoolExecutor:
    """The one thread every metered run of the process runs on. glibc gives it a malloc arena of its own, so its
    blocks do not reuse chunks that other threads freed into the main heap (reused, then freed, such a chunk
    stays resident: on the main thread a 7 MiB step read up to 25% high); and it keeps one OpenMP team from
    its first run on (a new thread per run starts a new team each time: GPT-2 small read +3.3%, not +0.2%)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainplan-meter")


def process_meter_available() -> bool:
    """Whether this system has the process-level meter: Linux's resettable high-water mark and glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim  # noqa: B018 (glibc only)
    except (OSError, AttributeError):
        return False
    return sys.platform.startswith("linux") and Path("/proc/self/clear_refs").exists()


class HighWaterMark:
    """The process's resident memory's rise between :meth:`start` and :meth:`read`: freed heap pages handed back
    (``malloc_trim``), the high-water mark reset (``/proc/self/clear_refs`` 5) and ``VmRSS`` read at the start,
    ``VmHWM`` less that at the read. For a step that a loop runs (a Trainer callback); see
    :func:`process_peak_during`."""

    def __init__(self) -> None:
        self.before = 0

    def start(self) -> None:
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
        self.before = _status_bytes("VmRSS")

    def read(self) -> int:
        return _status_bytes("VmHWM") - self.before


def process_peak_during(run: Callable[[], Any]) -> tuple[Any, int]:
    """``run()``'s result and the most the process's resident memory rose above what it was before
    (:class:`HighWaterMark`), ``run()`` on the meter thread (:func:`_meter_thread`). It counts everything the run
    holds: torch's allocator, numpy buffers (host copies on the CPU), BLAS workspaces, allocator rounding, the
    interpreter. It tracks live bytes only while freed memory goes back to the system
    (``timing.return_freed_memory``), set before the meter thread's first run. ``run()`` uses the caller's torch
    thread count (a thread started without it ran GPT-2's matmuls on every core)."""
    outs, peaks = process_peaks_during([run])
    return outs[0], peaks[0]


def process_peaks_during(phases: Sequence[Callable[[], Any]]) -> tuple[list[Any], list[int]]:
    """Each phase's result, the phases run one after another on one meter reading (as
    :func:`process_peak_during`), and the most the process's resident memory rose above what it was before the
    first, through the end of each phase: the last is the whole run's peak (a training step's forward and
    backward, then its optimizer step)."""
    threads = torch.get_num_threads()
    mark = HighWaterMark()

    def on_meter_thread() -> tuple[list[Any], list[int]]:
        torch.set_num_threads(threads)  # a new thread's BLAS and OpenMP take every core, whatever the caller set
        outs, peaks = [], []
        for phase in phases:
            outs.append(phase())
            peaks.append(mark.read())
        return outs, peaks

    mark.start()
    return _meter_thread().submit(on_meter_thread).result()


def _pinned_peak_during(run: Callable[[], Any], device: torch.device) -> int:
    """The most pinned host memory (CUDA's host allocator, blocks rounded up to powers of two) rose during
    ``run()`` above what it held before. Untested on a GPU here."""
    torch.cuda.reset_peak_host_memory_stats()
    before = int(torch.cuda.host_memory_stats().get("active_bytes.current", 0))
    run()
    torch.cuda.synchronize(device)
    return int(torch.cuda.host_memory_stats().get("active_bytes.peak", before)) - before


@dataclass(frozen=True)
class Peaks:
    """Peak bytes of a compiled plan's run, the bytes held at its start (inputs) included: torch's allocator
    (device bytes on CUDA), the process's resident memory (CPU; one value per reading) and pinned host bytes
    (CUDA). None where not measured."""

    allocator: int | None
    allocator_method: str
    process_readings: list[int] = field(default_factory=list)
    host_pinned: int | None = None

    @property
    def process(self) -> int | None:
        return int(statistics.median(self.process_readings)) if self.process_readings else None

    def counted(self, model: MemoryModel) -> tuple[str, int | None]:
        """The peak the budget counts under ``model``, and its name: on the CPU with shared host memory the
        process's (host copies included), with separate host memory the allocator's (device bytes); on CUDA
        the device's, plus the pinned host bytes where host memory is shared."""
        if model.device_type == "cpu":
            shared = model.host_memory == "shared" and self.process is not None
            return ("peak_bytes_process", self.process) if shared else ("peak_bytes_allocator", self.allocator)
        if model.host_memory == "shared" and self.allocator is not None and self.host_pinned is not None:
            return "peak_bytes_allocator + peak_bytes_host_pinned", self.allocator + self.host_pinned
        return "peak_bytes_allocator", self.allocator

    def to_dict(self) -> dict[str, Any]:
        return {"peak_bytes_allocator": self.allocator, "allocator_method": self.allocator_method,
                "peak_bytes_process": self.process, "process_readings_bytes": self.process_readings,
                "process_method": "VmHWM after clear_refs, above VmRSS before, on the meter thread, freed "
                                  "memory returned (median of the readings)" if self.process_readings else None,
                "peak_bytes_host_pinned": self.host_pinned}


def measure_peaks(run: Callable[[], Any], device: torch.device, start_bytes: int, *, readings: int = 3) -> Peaks:
    """Peak bytes of ``run`` (its outputs released on return, after the peaks counted them) at every level:
    the allocator's (:func:`peak_during`), then on the CPU ``readings`` runs of the process meter after one
    unread warm-up on its thread (:func:`process_peak_during`; none where the system lacks it), on CUDA one
    run for the pinned host bytes. ``start_bytes``: what the run's inputs hold, counted in every peak."""
    extra = peak_during(run, device)[1]
    allocator = None if extra is None else start_bytes + extra
    if device.type == "cuda":
        return Peaks(allocator, "torch.cuda.max_memory_allocated", host_pinned=_pinned_peak_during(run, device))
    if not process_meter_available():
        return Peaks(allocator, "torch.profiler memory events")
    process_peak_during(run)
    return Peaks(allocator, "torch.profiler memory events",
                 [start_bytes + process_peak_during(run)[1] for _ in range(readings)])
