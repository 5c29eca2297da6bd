"""Statistics of measured timings (kept apart from ``trainplan.timing``, which decides how they are taken)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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
