"""Timing hygiene shared by the profile and the validation: no cyclic garbage collection inside a timed run."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


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
