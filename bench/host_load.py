"""How busy the host was while a bench ran, in the words its tables use."""

from __future__ import annotations

import os


def load_label(loads: list[float]) -> str:
    """'alone on the host' or '**measured under load**', with the 1-minute load averages sampled during the run;
    under load when any sample exceeds the core count (the bench itself keeps about one core busy)."""
    cores = os.cpu_count() or 1
    lo, hi = min(loads), max(loads)
    seen = f"{hi:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f}"
    if hi > cores:
        return f"**measured under load** (1-minute load average {seen} on {cores} cores)"
    return f"run alone on the host (1-minute load average {seen} on {cores} cores)"
