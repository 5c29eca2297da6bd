"""Host-memory hygiene of the timed runs: with freed memory kept, a step's second allocation faults no pages."""

import resource
import sys

import pytest
import torch

from trainplan.timing import keep_freed_memory

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
