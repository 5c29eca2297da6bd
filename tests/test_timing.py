"""Host-memory hygiene of the timed runs: with freed memory kept, a step's second allocation faults no pages."""

import resource
import sys

import numpy as np
import pytest
import torch

from trainplan.timing import keep_freed_memory, paired_speedup_ci

MIB = 2**20


def _faults_to_fill(nbytes: int) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty(nbytes, dtype=torch.uint8)
    t.fill_(1)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    del t
    return after - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_kept_memory_is_reused_without_page_faults():
    said = keep_freed_memory()
    assert said.startswith("glibc malloc keeps freed memory"), said
    pages = 64 * MIB // 4096  # above glibc's largest mmap threshold (32 MiB): mmapped afresh by default
    _faults_to_fill(64 * MIB)  # grows the heap once
    again = [_faults_to_fill(64 * MIB) for _ in range(5)]
    # the least: this VM's DAMON sometimes pages idle memory out between two fills (docs/validation.md)
    assert min(again) < 0.05 * pages, f"{again} faults for {pages} pages of reused memory"


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
