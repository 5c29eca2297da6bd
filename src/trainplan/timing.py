"""Timing hygiene shared by the profile and the validation: no cyclic garbage collection inside a timed run,
and host memory that a freed tensor leaves behind kept for the next one (no page faults in steady state)."""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc <malloc.h>


@contextmanager
def gc_paused() -> Iterator[None]:
    """Collect garbage, then keep the cyclic collector off for the block (as ``timeit`` does).

    Cyclic garbage left by one run (tensors included) is freed before the next, so no run pays for an
    earlier run's memory or for a collection that happens to start inside it. Only the outermost pause
    collects: a pause nested in another one (the collector already off) does not, so a caller timing many
    small things in a row can pause once around a batch of them (a collection takes 0.05-0.15 s in a process
    holding torch and a transformers model).
    """
    enabled = gc.isenabled()
    if enabled:
        gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def live_objects_frozen(collect: bool = True) -> Iterator[None]:
    """Keep every object alive at the block's start (after a collection, if ``collect``) out of the cyclic
    collector's scans for the block (``gc.freeze``, ``gc.unfreeze`` after it), so that each collection in it
    traverses only what was allocated since: 0.09-0.18 s a collection in a process holding torch (and a
    transformers model), under 1 ms frozen. For a caller that collects hundreds of times (``gc_paused`` before
    each conv, sweep shape or repetition timed) or under a time limit; the timed runs themselves are unchanged.
    Not nested: the inner block's end would unfreeze the outer one's objects."""
    if collect:
        gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


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
