"""The seed's boundary fine-tuning: move boundary ops (with their neighbours in the order) across a cut
when that lowers the bytes crossing stage boundaries and keeps the bottleneck within a tolerance."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainplan.partition.graph import PipelineGraph
from trainplan.partition.memory_limit import MemoryLimit
from trainplan.partition.tables import RangeTables


@dataclass(frozen=True)
class Move:
    """Cut ``cut`` (between stages cut-1 and cut) moved from forward position ``old`` to ``new``."""

    cut: int
    old: int
    new: int
    bytes_delta: int


@dataclass(frozen=True)
class Refined:
    cuts: tuple[int, ...]
    start_bytes: int
    end_bytes: int
    limit: float  # largest stage weight allowed: (1 + tolerance) x the starting bottleneck
    moves: list[Move] = field(default_factory=list)


def total_boundary_bytes(tables: RangeTables, cuts: tuple[int, ...]) -> int:
    """Bytes received over all stages (each storage once per stage that reads it from another)."""
    return int(sum(tables.boundary[a, b] for a, b in zip(cuts, cuts[1:])))


def bottleneck(prefix: np.ndarray, cuts: tuple[int, ...]) -> float:
    return float(max(prefix[b] - prefix[a] for a, b in zip(cuts, cuts[1:])))


def _candidates(graph: PipelineGraph, a: int, c: int, b: int) -> np.ndarray:
    """New positions for cut c (stages [a, c) and [c, b)) that move one boundary op with its neighbours.

    A forward position is a boundary op when one of its ops has a producer or consumer in another
    stage; moving position q < c across takes q..c-1 along (new cut q), q >= c takes c..q (new cut q+1);
    only cuts the graph allows (``cut_ok``).
    """
    lo, hi = graph.neighbour_lo, graph.neighbour_hi
    left = np.arange(a, c)
    left = left[(lo[a:c] < a) | (hi[a:c] >= c)]
    right = np.arange(c, b)
    right = right[(lo[c:b] < c) | (hi[c:b] >= b)] + 1
    new = np.concatenate([left, right])
    new = new[(new > a) & (new < b) & (new != c)]
    return new[graph.cut_ok[new]]


def refine_cuts(graph: PipelineGraph, tables: RangeTables, position_weights: np.ndarray,
                cuts: tuple[int, ...], tolerance: float, memory: MemoryLimit | None = None) -> Refined:
    """Sweep the cuts, each time taking the move that lowers boundary bytes most, until none does.

    Every stage stays within (1 + ``tolerance``) x the starting bottleneck and, with ``memory``, admissible;
    the total boundary bytes strictly decrease with every move, so the loop ends.
    """
    prefix = np.concatenate([[0.0], np.cumsum(position_weights)])
    limit = (1.0 + tolerance) * bottleneck(prefix, cuts)
    k = len(cuts) - 1
    ok = [memory.admissible(tables, s, k) if memory else None for s in range(k)]
    current = list(cuts)
    moves: list[Move] = []
    changed = True
    while changed:
        changed = False
        for s in range(1, k):
            a, c, b = current[s - 1], current[s], current[s + 1]
            new = _candidates(graph, a, c, b)
            fits = (prefix[new] - prefix[a] <= limit) & (prefix[b] - prefix[new] <= limit)
            if memory is not None:
                fits &= ok[s - 1][a, new] & ok[s][new, b]
            new = new[fits]
            if not len(new):
                continue
            delta = (tables.boundary[a, new] + tables.boundary[new, b]
                     - tables.boundary[a, c] - tables.boundary[c, b])
            best = int(np.argmin(delta))
            if delta[best] < 0:
                current[s] = int(new[best])
                moves.append(Move(s, c, int(new[best]), int(delta[best])))
                changed = True
    start = total_boundary_bytes(tables, cuts)
    return Refined(tuple(current), start, total_boundary_bytes(tables, tuple(current)), limit, moves)
