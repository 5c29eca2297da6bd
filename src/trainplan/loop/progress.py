"""A progress bar for one planning phase that runs as a single call (tracing, solving): elapsed seconds,
against the phase's time limit where it has one."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm

TICK_S = 0.25  # how often the bar's elapsed time is redrawn


@contextmanager
def phase_bar(desc: str, enabled: bool, limit_s: float | None = None) -> Iterator[None]:
    """A tqdm bar counting the block's seconds (up to ``limit_s`` when given), redrawn from a thread."""
    if not enabled:
        yield
        return
    bar = tqdm(total=limit_s, desc=desc, unit="s", bar_format=None if limit_s else "{desc}: {elapsed}")
    stop = threading.Event()
    start = time.perf_counter()

    def tick() -> None:
        while not stop.wait(TICK_S):
            bar.n = round(min(time.perf_counter() - start, limit_s or float("inf")), 1)
            bar.refresh()

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.n = round(min(time.perf_counter() - start, limit_s or float("inf")), 1)
        bar.close()
