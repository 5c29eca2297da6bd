"""Timing hygiene shared by the profile and the validation: no cyclic garbage collection inside a timed run,
and host memory that a freed tensor leaves behind kept for the next one (no page faults in steady state)."""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Sequence
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc <malloc.h>


@contextmanager
def gc_paused() -> Iterator[None]:
    """Collect garbage, then keep the cyclic collector off for the block (as ``timeit`` does).

    Cyclic garbage left by one run (tensors included) is freed before the next, so no run pays for an
    earlier run's memory or for a collection that happens to start inside it.
    """
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def keep_freed_memory() -> str:
    """Make glibc's malloc keep freed memory for reuse, for the rest of the process: no ``mmap`` for big
    blocks and no trimming of the heap (``mallopt(M_MMAP_MAX, 0)``, ``mallopt(M_TRIM_THRESHOLD, 2^31 - 1)``).

    By default every tensor above the mmap threshold (at most 32 MiB) gets fresh pages from the kernel and
    returns them on free, so each step pays a page fault (and zeroing) per 4 KiB it allocates: about 290k
    faults, a fifth of GPT-2's CPU step on this host, varying with the host. With the heap kept, a step
    reuses the pages of the step before, as a caching allocator (CUDA's) does, and the profile and the
    validation time the same steady state. Returns what was set, for the artifacts."""
    if not sys.platform.startswith("linux"):
        return "unchanged: not Linux"
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return "unchanged: no glibc mallopt"
    if mallopt(M_MMAP_MAX, 0) != 1 or mallopt(M_TRIM_THRESHOLD, 2**31 - 1) != 1:
        return "unchanged: mallopt refused"
    return "glibc malloc keeps freed memory (M_MMAP_MAX 0, M_TRIM_THRESHOLD 2^31-1)"


def paired_speedup_ci(base: Sequence[float], new: Sequence[float], seed: int = 0, level: float = 0.95,
                      resamples: int = 2000) -> tuple[float, float]:
    """Bootstrap confidence interval of median(base) / median(new) from paired samples (``base[i]`` and
    ``new[i]`` timed in the same round): rounds are resampled together, so a load change that hits both
    runs of a round cancels. Seeded: the same samples give the same interval."""
    a, b = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired samples differ in count: {a.size} and {b.size}")
    idx = np.random.default_rng(seed).integers(0, a.size, size=(resamples, a.size))
    ratios = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    tail = (1.0 - level) / 2
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1.0 - tail))
