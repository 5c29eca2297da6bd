"""Statistics of measured timings."""

from __future__ import annotations

import numpy as np
import pytest

from trainplan.stats import paired_speedup_ci


def test_paired_speedup_interval_separates_a_real_speedup_from_noise():
    rng = np.random.default_rng(1)
    drift = 0.1 * (1 + rng.uniform(0, 0.3, 9))  # a load change per round hits both runs of the round
    base = drift * (1 + rng.uniform(-0.02, 0.02, 9))
    faster = drift / 1.2 * (1 + rng.uniform(-0.02, 0.02, 9))
    low, high = paired_speedup_ci(base, faster)
    assert 1.0 < low < 1.2 < high < 1.3
    same = drift * (1 + rng.uniform(-0.02, 0.02, 9))
    low, high = paired_speedup_ci(base, same)
    assert low < 1.0 < high
    assert paired_speedup_ci(base, same, seed=3) == paired_speedup_ci(base, same, seed=3)
    with pytest.raises(ValueError, match="differ in count"):
        paired_speedup_ci(base, same[:-1])
