"""Maximality and the contracted-graph check.

Why single-input/single-output groups never create a cycle: an edge entering a group ends at a member
with a predecessor outside, i.e. its input op i; an edge leaving starts at its output op o; and inside the
group i reaches o (i is the only member without a predecessor inside, so every member is reachable from it).
A cycle of the contracted graph therefore lifts to a cycle of
the original DAG. ``contract_order`` still checks it by a topological sort, as the seed asks.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from trainplan.fuse.errors import FuseError
from trainplan.fuse.graph import OpGraph


class _Groups:
    """Union-find over nodes; each root keeps its group's input op and output op."""

    def __init__(self, n: int, pieces: Sequence[Sequence[int]], ends: Sequence[tuple[int, int]]) -> None:
        self.parent = list(range(n))
        self.ends: dict[int, tuple[int, int]] = {}
        for piece, end in zip(pieces, ends):
            root = piece[0]
            for u in piece:
                self.parent[u] = root
            self.ends[root] = end

    def find(self, u: int) -> int:
        root = u
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[u] != root:
            self.parent[u], u = root, self.parent[u]
        return root


def merge_groups(graph: OpGraph, pieces: Sequence[Sequence[int]], ends: Sequence[tuple[int, int]],
                 eligible: Sequence[bool]) -> tuple[list[list[int]], list[tuple[int, int]], int]:
    """Greedily merge groups joined by an edge while the union keeps one input op and one output op.

    ``pieces`` must cover every eligible node, each with its (input op, output op) in ``ends``. Edges are
    tried in topological order, repeated until a full pass merges nothing, so no two adjacent groups can be
    merged any more (a merge only needs the two groups' current input and output ops: the union's input
    ops are among them). Returns the groups, their ends and the number of merges.
    """
    groups = _Groups(graph.n, pieces, ends)
    merges = 0
    changed = True
    while changed:
        changed = False
        for u in graph.order:
            if not eligible[u]:
                continue
            for v in graph.succs[u]:
                if not eligible[v]:
                    continue
                a, b = groups.find(u), groups.find(v)
                if a != b and _try_merge(graph, groups, a, b):
                    merges += 1
                    changed = True
    by_root: dict[int, list[int]] = {}
    for piece in pieces:
        for u in piece:
            by_root.setdefault(groups.find(u), []).append(u)
    roots = list(by_root)
    return [by_root[r] for r in roots], [groups.ends[r] for r in roots], merges


def _try_merge(graph: OpGraph, groups: _Groups, a: int, b: int) -> bool:
    pair = (a, b)
    (ia, oa), (ib, ob) = groups.ends[a], groups.ends[b]
    ins = [x for x in {ia, ib} if not graph.preds[x] or any(groups.find(p) not in pair for p in graph.preds[x])]
    outs = [x for x in {oa, ob} if not graph.succs[x] or any(groups.find(s) not in pair for s in graph.succs[x])]
    if len(ins) != 1 or len(outs) != 1:
        return False
    groups.parent[b] = a
    del groups.ends[b]
    groups.ends[a] = (ins[0], outs[0])
    return True


def contract_order(graph: OpGraph, groups: Sequence[Sequence[int]]) -> list[int]:
    """Topological order of the contracted graph's nodes (group k -> -1-k, others keep their index).

    Raises FuseError naming the groups on a cycle when contraction does not leave a DAG.
    """
    label = list(range(graph.n))
    for k, members in enumerate(groups):
        for u in members:
            label[u] = -1 - k
    dag = nx.DiGraph()
    dag.add_nodes_from(set(label))
    dag.add_edges_from((label[u], label[v]) for u, v in graph.edges() if label[u] != label[v])
    try:
        return list(nx.lexicographical_topological_sort(dag))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(dag)
        names = sorted({f"group {-1 - x}" if x < 0 else f"node '{graph.names[x]}'" for edge in cycle for x in edge})
        raise FuseError(f"contracting the groups leaves a cycle through {', '.join(names)}") from None
