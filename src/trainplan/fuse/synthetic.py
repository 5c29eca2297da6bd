"""Seeded random DAGs with random support masks (tests and the benchmark)."""

from __future__ import annotations

import random

from trainplan.fuse.graph import OpGraph, build_graph


def random_dag(n: int, seed: int, *, max_preds: int = 3, window: int = 12, p_skip: float = 0.1) -> OpGraph:
    """``n`` ops in order; op i reads 1..max_preds earlier ops, mostly from the last ``window`` (a long skip
    with probability ``p_skip``), like the layer structure of a network; 5% of ops read nothing."""
    rng = random.Random(seed)
    edges = []
    for i in range(1, n):
        if rng.random() < 0.05:
            continue
        for _ in range(rng.randint(1, max_preds)):
            lo = 0 if rng.random() < p_skip else max(0, i - window)
            edges.append((f"n{rng.randint(lo, i - 1)}", f"n{i}"))
    return build_graph([f"n{i}" for i in range(n)], ["op"] * n, edges)


def random_mask(n: int, seed: int, p_supported: float) -> list[bool]:
    """Each op supported with probability ``p_supported``."""
    rng = random.Random(seed)
    return [rng.random() < p_supported for _ in range(n)]
