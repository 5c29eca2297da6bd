"""Per-range stage quantities for every contiguous forward range [i, j), as (n+1) x (n+1) matrices.

Stage costs depend only on the range of forward positions (see ``graph.py``), so the DP and the
refinement read them in O(1): ``boundary[i, j]`` is the bytes the stage [i, j) receives (non-fixed
storages it reads that another stage allocates), ``stash[i, j]`` the activation bytes it keeps from a
micro-batch's forward to its backward (storages allocated in forward and read by its backward ops,
received ones included), ``fixed[i, j]`` the parameter/buffer/batch bytes its ops read.
Entries with j <= i are 0. Memory is O(n_forward^2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainplan.partition.graph import PipelineGraph, Reads


@dataclass(frozen=True)
class RangeTables:
    """Bytes of each contiguous forward range; see the module docstring."""

    boundary: np.ndarray
    stash: np.ndarray
    fixed: np.ndarray


def _reached(n: int, reads: Reads, sizes: np.ndarray, producer: np.ndarray | None = None) -> np.ndarray:
    """R[i, j] = bytes of storages read by a key in [i, j) (and, given ``producer``, allocated outside it).

    Sweeps i downwards keeping each storage's next reader key >= i: a storage counts from
    j = next + 1 on, and (with a producer p >= i) stops counting from j = max(p, next) + 1.
    """
    out = np.zeros((n + 1, n + 1), dtype=np.int64)
    nxt = np.full(len(sizes), n, dtype=np.int64)
    by_key = np.argsort(reads.key, kind="stable")
    starts = np.searchsorted(reads.key[by_key], np.arange(n + 1))
    for i in range(n - 1, -1, -1):
        nxt[reads.storage[by_key[starts[i]:starts[i + 1]]]] = i
        has = nxt < n
        row = np.bincount(nxt[has] + 1, weights=sizes[has], minlength=n + 2)
        if producer is not None:
            inside = has & (producer >= i)
            row -= np.bincount(np.maximum(producer, nxt)[inside] + 1, weights=sizes[inside], minlength=n + 2)
        out[i] = np.cumsum(row[: n + 1]).astype(np.int64)
    return out


def range_tables(graph: PipelineGraph) -> RangeTables:
    """Boundary, stash and fixed bytes of every contiguous forward range of ``graph``."""
    n = graph.n_forward
    sizes = graph.storage_bytes.astype(float)
    return RangeTables(
        boundary=_reached(n, graph.reads, sizes, graph.producer_key),
        stash=_reached(n, graph.stash_reads, sizes),
        fixed=_reached(n, graph.fixed_reads, graph.fixed_bytes.astype(float)),
    )
