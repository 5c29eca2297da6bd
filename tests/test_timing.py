"""Hygiene of the timed runs: with freed memory kept, a step's second allocation faults no pages; with the
objects alive at the start frozen, the collections between runs scan only what came after, and still free it."""

import gc
import resource
import sys
import weakref

import pytest
import torch

from trainplan.timing import gc_paused, keep_freed_memory, live_objects_frozen

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


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_frozen_objects_leave_collections_which_still_free_new_cycles():
    before = [_Node() for _ in range(1000)]  # alive at the start: scanned by every collection unless frozen
    with live_objects_frozen():
        frozen = gc.get_freeze_count()
        assert frozen >= len(before)
        node = _Node()
        gone = weakref.ref(node)
        del node
        with gc_paused():  # the collection at the start of a timed block frees the cycle made since the freeze
            assert gone() is None and not gc.isenabled()
        assert gc.isenabled() and gc.get_freeze_count() == frozen
    assert gc.get_freeze_count() == 0  # unfrozen after: the process's objects are collectable again
