"""Seed 002's two partitions and its pruning: supported regions, then pieces with one input op and one output op.

Definitions (for a set S of nodes of the whole graph): an *input op* of S is a member with a predecessor
outside S or with no predecessor at all; an *output op* is a member with a successor outside S or with no
successor at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from trainplan.fuse.graph import OpGraph


def components(graph: OpGraph, members: Iterable[int]) -> list[list[int]]:
    """Weakly connected components of the subgraph induced by ``members``, each sorted, in order of their first node."""
    inside = set(members)
    seen: set[int] = set()
    out: list[list[int]] = []
    for start in sorted(inside):
        if start in seen:
            continue
        seen.add(start)
        stack, comp = [start], []
        while stack:
            u = stack.pop()
            comp.append(u)
            for v in (*graph.preds[u], *graph.succs[u]):
                if v in inside and v not in seen:
                    seen.add(v)
                    stack.append(v)
        out.append(sorted(comp))
    return out


def input_ops(graph: OpGraph, members: set[int]) -> list[int]:
    """Members with a predecessor outside ``members`` or none."""
    return [u for u in members if not graph.preds[u] or any(p not in members for p in graph.preds[u])]


def output_ops(graph: OpGraph, members: set[int]) -> list[int]:
    """Members with a successor outside ``members`` or none."""
    return [u for u in members if not graph.succs[u] or any(s not in members for s in graph.succs[u])]


def _walks(starts: Sequence[int], members: set[int], step: Sequence[Sequence[int]]) -> list[list[int]]:
    """One walk per start along ``step`` edges inside ``members``; a walk stops at the other starts and at
    nodes an earlier walk took, so every member reachable from a start ends up in exactly one walk."""
    stop = set(starts)
    taken: set[int] = set()
    pieces = []
    for start in starts:
        if start in taken:
            continue
        taken.add(start)
        stack, piece = [start], [start]
        while stack:
            u = stack.pop()
            for v in step[u]:
                if v in members and v not in taken and v not in stop:
                    taken.add(v)
                    piece.append(v)
                    stack.append(v)
        pieces.append(piece)
    return pieces


def prune(graph: OpGraph, region: Sequence[int], position: Sequence[int]) -> tuple[list[list[int]], int]:
    """Split a connected region into pieces with exactly one input op and one output op (the seed's iteration).

    A piece with several output ops is walked in reverse from each output op (latest in ``position``, the
    topological rank, first), each walk stopping at the other output ops and at nodes already taken; a
    piece with one output op and several input ops is walked forward from each input op (earliest first),
    stopping at the other input ops. A piece with both gets the reverse walks first and, in the next round,
    the forward walks. Each walk's nodes form a new piece; every piece is re-examined until it qualifies.
    Every round splits a piece into at least two (the other starts are never taken), so this terminates;
    a single op always qualifies. Returns the pieces and the number of rounds.
    """
    done: list[list[int]] = []
    work = [list(region)]
    rounds = 0
    while work:
        piece = work.pop()
        members = set(piece)
        outs = output_ops(graph, members)
        ins = input_ops(graph, members)
        if len(ins) == 1 and len(outs) == 1:
            done.append(sorted(piece, key=position.__getitem__))
            continue
        rounds += 1
        if len(outs) > 1:
            walks = _walks(sorted(outs, key=position.__getitem__, reverse=True), members, graph.preds)
        else:
            walks = _walks(sorted(ins, key=position.__getitem__), members, graph.succs)
        work.extend(walks)
    return done, rounds
