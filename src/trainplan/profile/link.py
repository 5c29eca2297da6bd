"""The host-link bandwidth plans cost transfers with: configured, or measured as plans use the link (the
executor's own swap-out and swap-in of a device storage)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from trainplan.host_swap import HostPool
from trainplan.timing import gc_paused


@dataclass(frozen=True)
class LinkMeasurement:
    """The sizes swapped (bytes, one storage each), the median seconds each direction took over the
    repetitions, and the bandwidth that makes ``bytes / bandwidth`` per transfer add up to the measured round
    trip. The sizes are recorded so that a later measurement can time the very same transfers."""

    sizes: tuple[int, ...]
    swap_out_s: float
    swap_in_s: float
    repeats: int

    @property
    def tensors(self) -> int:
        return len(self.sizes)

    @property
    def bytes_per_direction(self) -> int:
        return int(sum(self.sizes))

    @property
    def bytes_per_s(self) -> float:
        return 2 * self.bytes_per_direction / (self.swap_out_s + self.swap_in_s)

    def to_dict(self) -> dict[str, float | int | list[int]]:
        return {"tensors": self.tensors, "bytes_per_direction": self.bytes_per_direction,
                "swap_out_s": self.swap_out_s, "swap_in_s": self.swap_in_s, "repeats": self.repeats,
                "bytes_per_s": self.bytes_per_s, "sizes": list(self.sizes)}


def sample_sizes(sizes: list[int], limit: int, max_bytes: int) -> list[int]:
    """At most ``limit`` of the positive ``sizes``, evenly spaced over the list (all of them if fewer), cut
    where their sum would pass ``max_bytes`` (the first is kept whatever its size)."""
    positive = [s for s in sizes if s > 0]
    step = max(1.0, len(positive) / limit)
    picked = [positive[int(i * step)] for i in range(min(limit, len(positive)))]
    out: list[int] = []
    for size in picked:
        if out and sum(out) + size > max_bytes:
            break
        out.append(size)
    return out


def measure_host_link(device: torch.device, sizes: list[int], *, repeats: int = 3, warmup: int = 1,
                      max_tensors: int = 256, max_bytes: int = 2**30) -> LinkMeasurement:
    """Swap a fresh device storage of each of a sample of ``sizes`` bytes (``sample_sizes``) out to the host
    and back in, through the executor's ``HostPool`` (numpy buffers on CPU, pinned memory on a side stream on
    CUDA), and time each direction over the sample: the median of ``repeats`` after ``warmup``. Each run frees
    what it swapped before the next, so after the warm-up the transfers reuse memory, as they do inside a step
    in steady state (CUDA's caching allocator; on the CPU, glibc's heap under ``keep_freed_memory``). Raises
    ValueError when no size is positive."""
    sizes = sample_sizes(sizes, max_tensors, max_bytes)
    if not sizes:
        raise ValueError("no tensor sizes to measure the host link with")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    sources = [torch.ones(n, dtype=torch.uint8, device=device).untyped_storage() for n in sizes]
    outs: list[float] = []
    ins: list[float] = []
    for i in range(warmup + repeats):
        host = HostPool(device)
        with gc_paused():
            sync()
            start = time.perf_counter()
            for sid, storage in enumerate(sources):
                host.save(sid, storage)
            sync()
            mid = time.perf_counter()
            back = [host.load(sid) for sid in range(len(sources))]
            sync()
            end = time.perf_counter()
        del back, host
        if i >= warmup:
            outs.append(mid - start)
            ins.append(end - mid)
    return LinkMeasurement(tuple(sizes), statistics.median(outs), statistics.median(ins), repeats)


def host_link_bytes_per_s(device: dict[str, Any], nodes: pd.DataFrame, *, repeats: int,
                          warmup: int) -> tuple[float, dict[str, Any]]:
    """The host-link bandwidth plans cost transfers with, and where it comes from.

    ``device["host_link_gbytes_per_s"]`` is either a number (a link to plan for, e.g. an accelerator's PCIe
    that this machine lacks) or ``"measured"``: the executor's own swap path, timed on a sample of the
    model's forward outputs (the tensors a plan swaps) by :func:`measure_host_link`.
    """
    setting = device["host_link_gbytes_per_s"]
    if setting != "measured":
        return float(setting) * 1e9, {"source": "config"}
    forward = nodes.loc[nodes.phase == "forward", "alloc_bytes"].astype(int).tolist()
    link = measure_host_link(torch.device(device["type"]), forward, repeats=repeats, warmup=warmup)
    return link.bytes_per_s, {"source": "measured", **link.to_dict()}
