"""Make the host allocator's behaviour independent of process history before timing CPU ops.

glibc serves large blocks with mmap above a threshold that it raises as blocks are freed, and trims
the heap when its top is free. So the same op costs a page fault per fresh page in one process and
nothing in another, depending on what ran before it: measured on ResNet-50 stages, 2.4x slower with
every block mmapped, and 5-30% between processes with the default settings. Profiling and validation
both call :func:`steady_host_allocator` first: no mmap, no trim, so freed memory is reused the way a
device caching allocator reuses it, and op times depend on the graph, not on the process's past.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc <malloc.h>
NO_TRIM = 2**31 - 1


def steady_host_allocator() -> str:
    """Set glibc malloc to never mmap and never trim; returns what was set (for the artifact's settings)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        log.warning("no glibc mallopt (%s): host allocator left as is; CPU op times may depend on history", name)
        return "default (mallopt unavailable)"
    ok = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, NO_TRIM) == 1
    if not ok:
        log.warning("mallopt refused the settings: host allocator left as is")
        return "default (mallopt refused)"
    return "glibc: mmap off, trim off"
