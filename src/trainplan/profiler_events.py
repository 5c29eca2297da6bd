"""torch.profiler's CPU memory events, for the meters that need them (the CPU allocator keeps no peak of its own)."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

log = logging.getLogger(__name__)


def memory_profile() -> torch.profiler.profile:
    """A profiler over CPU ops that records allocator events. Kineto writes a ``USDT: ... profiler_start`` /
    ``profiler_stop`` line to stderr around every session at its log level 5; level 6 (read when kineto first
    starts, so set before the first session) keeps a per-op meter's log readable. A user's own
    ``KINETO_LOG_LEVEL`` wins."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU], profile_memory=True)


def event_roots(prof: torch.profiler.profile, what: str) -> list[Any] | None:
    """The roots of a finished session's event tree, or None (with a warning naming ``what`` is lost) where
    torch's private tree API has moved: say so rather than guess."""
    try:
        return list(prof.profiler.kineto_results.experimental_event_tree())
    except AttributeError:
        log.warning("profiler event tree unavailable: %s", what)
        return None
