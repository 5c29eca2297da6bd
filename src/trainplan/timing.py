"""Timing hygiene shared by the profile and the validation: no cyclic garbage collection inside a timed run,
and host memory that a freed tensor leaves behind kept for the next one (no page faults in steady state), or,
while memory is metered, returned to the system."""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # glibc <malloc.h>
MMAP_MAX_DEFAULT = 65536  # glibc's DEFAULT_MMAP_MAX


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


def _mallopt(settings: dict[int, int]) -> str | None:
    """Apply glibc ``mallopt`` settings (parameter -> value); None if done, else why not."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return "no glibc mallopt"
    if not all(mallopt(param, value) == 1 for param, value in settings.items()):
        return "mallopt refused"
    return None


def keep_freed_memory() -> str:
    """Make glibc's malloc keep freed memory for reuse, for the rest of the process: no ``mmap`` for big
    blocks and no trimming of the heap (``mallopt(M_MMAP_MAX, 0)``, ``mallopt(M_TRIM_THRESHOLD, 2^31 - 1)``).

    By default every tensor above the mmap threshold (at most 32 MiB) gets fresh pages from the kernel and
    returns them on free, so each step pays a page fault (and zeroing) per 4 KiB it allocates: about 290k
    faults, a fifth of GPT-2's CPU step on this host, varying with the host. With the heap kept, a step
    reuses the pages of the step before, as a caching allocator (CUDA's) does, and the profile and the
    validation time the same steady state. Returns what was set, for the artifacts."""
    why = _mallopt({M_MMAP_MAX: 0, M_TRIM_THRESHOLD: 2**31 - 1})
    return f"unchanged: {why}" if why else "glibc malloc keeps freed memory (M_MMAP_MAX 0, M_TRIM_THRESHOLD 2^31-1)"


def return_freed_memory() -> str:
    """Make glibc's malloc return freed memory to the system, so the process's resident memory tracks the bytes
    it holds (the process-level meter, ``execute.measure``): every block of 64 KiB or more mapped on its own and
    unmapped on free, the heap trimmed down at every free (``M_MMAP_THRESHOLD`` 64 KiB, ``M_TRIM_THRESHOLD`` 0,
    ``M_MMAP_MAX`` glibc's default). Set in the process (the same as ``MALLOC_MMAP_THRESHOLD_=65536
    MALLOC_TRIM_THRESHOLD_=0`` in its environment); it acts on later allocations, so set it before the runs to
    meter (:func:`keep_freed_memory` undoes it). Returns what was set, for the artifacts."""
    why = _mallopt({M_MMAP_MAX: MMAP_MAX_DEFAULT, M_MMAP_THRESHOLD: 64 * 1024, M_TRIM_THRESHOLD: 0})
    return f"unchanged: {why}" if why else \
        "glibc malloc returns freed memory (M_MMAP_THRESHOLD 64 KiB, M_TRIM_THRESHOLD 0)"
