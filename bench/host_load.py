"""How busy and how fast the host was while a bench ran, in the words its tables use."""

from __future__ import annotations

import os
import statistics
import time

MATMUL_N = 2048  # the reference: an N x N fp32 matmul (17 GFLOP), long enough to time, short enough to repeat


def load_label(loads: list[float], *, fills_cores: bool = False) -> str:
    """'alone on the host' or '**measured under load**', with the 1-minute load averages sampled during the run;
    under load when any sample exceeds the core count (the bench itself keeps about one core busy). A bench that
    keeps every core busy itself (``fills_cores``: a workflow at --cores = the host's) gets the averages only, as
    they cannot tell another process from its own."""
    cores = os.cpu_count() or 1
    lo, hi = min(loads), max(loads)
    seen = f"{hi:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f}"
    if fills_cores:
        return (f"1-minute load average {seen} on {cores} cores, the bench's own work included (it keeps the cores "
                "busy: run it with nothing else on the host)")
    if hi > cores:
        return f"**measured under load** (1-minute load average {seen} on {cores} cores)"
    return f"run alone on the host (1-minute load average {seen} on {cores} cores)"


def matmul_gflops(threads: int = 2, repeats: int = 5) -> float:
    """The host's speed as GFLOP/s of an N x N fp32 matmul on ``threads`` threads, median of ``repeats`` after
    two warm-ups: the same host measured 61 and 190 on two days, so a table's timings read against it."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(MATMUL_N, MATMUL_N), torch.randn(MATMUL_N, MATMUL_N)
    seconds = []
    for i in range(repeats + 2):
        t = time.perf_counter()
        a @ b
        if i >= 2:
            seconds.append(time.perf_counter() - t)
    return 2 * MATMUL_N ** 3 / statistics.median(seconds) / 1e9
