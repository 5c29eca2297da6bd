"""Groups of more than ``max_ops`` ops split into a chain of pieces that keep the seed's rule.

A fused op is recomputed whole (``trainplan.schedule.stage_problem``): a group that covers most of a model (ResNet-50's
trunk, stem to pooling, is one group of 228 forward ops) leaves a plan nothing to recompute but that group. Splitting
it trades fusion (fewer, larger kernels and fewer saved intermediates) for finer recompute choices.

A **cut** of a group with one input op ``i`` and one output op ``o`` is an edge ``v -> w`` between members that is
the only edge from ``A`` (``v`` and its ancestors in the group) to the other members. Then ``A`` has one input op
(``i``: every member descends from it) and one output op (``v``), the rest one input op (``w``) and one output op
(``o``), and contracting both leaves a DAG (``A`` reaches the rest through ``v -> w`` only): each piece is a group
under the seed's rule. The ``A`` of two cuts are nested (what ``A_1`` does not hold is reached through ``w_1``), so
a group's cuts form a chain and cut it into segments (ResNet-50's trunk: one per residual block, at the block's
``add_ -> relu``). Pieces are runs of consecutive segments, greedily as long as they stay within ``max_ops`` (the
fewest pieces). A segment larger than ``max_ops`` has no cut, but the group still splits into **runs** of
consecutive ops of its topological order, each with one input op and one output op (a residual block: ``conv1
bn1 relu1``, ``conv2 bn2 relu2``, ``conv3 bn3``, ``add relu``, whose ``add`` is its only op reading outside it):
contracting runs of one topological order leaves a DAG (every edge goes forward). Such a group is split into the
fewest runs within ``max_ops`` (a dynamic programme over its order; an op alone is such a run, so they always
exist and ``max_ops`` is a strict cap). Only the
maximality the seed's merge gives is given up, and only for unions larger than ``max_ops`` (``check_grouping``'s
``max_ops``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainplan.fuse.graph import OpGraph
from trainplan.fuse.prune import input_ops, output_ops

#: the default cap (config ``fuse.fused_ops.max_ops``): leaves GPT-2's groups (at most 23 forward ops: an MLP block)
#: and Llama's whole and cuts ResNet-50's trunk (228 ops) into its residual blocks (13-16 ops); a lower cap splits
#: the blocks into runs (finer recompute, more scheduling ops and smaller kernels)
MAX_OPS = 24


def cuts(graph: OpGraph, nodes: Sequence[int]) -> list[tuple[int, int, frozenset[int]]]:
    """The cuts ``(v, w, A)`` of the group ``nodes`` (one input op, one output op), smallest ``A`` first."""
    members = set(nodes)
    found = []
    for v in nodes:
        inside = {s for s in graph.succs[v] if s in members}
        if len(inside) != 1 or not inside >= set(graph.succs[v]):  # the output op feeds outside the group
            continue
        ancestors, stack = {v}, [v]
        while stack:
            for p in graph.preds[stack.pop()]:
                if p in members and p not in ancestors:
                    ancestors.add(p)
                    stack.append(p)
        crossing = {(a, s) for a in ancestors for s in graph.succs[a] if s in members and s not in ancestors}
        if len(crossing) == 1:
            found.append((v, inside.pop(), frozenset(ancestors)))
    return sorted(found, key=lambda c: len(c[2]))


def split_group(graph: OpGraph, nodes: Sequence[int], first: int, last: int, max_ops: int
                ) -> list[tuple[list[int], int, int]]:
    """The group ``nodes`` (topological order, input op ``first``, output op ``last``) as pieces ``(members,
    input op, output op)`` of at most ``max_ops`` ops: runs of the segments between its cuts, or where a segment is
    over the cap the group as :func:`runs` of its order; itself when it has at most ``max_ops``."""
    if len(nodes) <= max_ops:
        return [(list(nodes), first, last)]
    chain = cuts(graph, nodes)
    bounds: list[tuple[frozenset[int], int, int]] = [(frozenset(), first, -1)]  # (A, its next input op, its output op)
    bounds += [(a, w, v) for v, w, a in chain] + [(frozenset(nodes), -1, last)]
    pieces, at = [], 0
    while at < len(bounds) - 1:
        end = at + 1
        while end + 1 < len(bounds) and len(bounds[end + 1][0]) - len(bounds[at][0]) <= max_ops:
            end += 1
        inside = bounds[end][0] - bounds[at][0]
        if len(inside) > max_ops:  # a segment over the cap: the whole group as runs of its order
            return runs(graph, nodes, max_ops)
        pieces.append(([u for u in nodes if u in inside], bounds[at][1], bounds[end][2]))
        at = end
    return pieces


def _ends(graph: OpGraph, members: set[int]) -> tuple[int, int] | None:
    """The input op and output op of ``members`` where it has one of each, else None."""
    ins, outs = input_ops(graph, members), output_ops(graph, members)
    return (ins[0], outs[0]) if len(ins) == 1 and len(outs) == 1 else None


def runs(graph: OpGraph, order: Sequence[int], max_ops: int) -> list[tuple[list[int], int, int]]:
    """``order`` (a topological order of a group's ops) as the fewest runs of consecutive ops, at most ``max_ops``
    (>= 1) each and each with one input op and one output op: ``(members, input op, output op)``."""
    n = len(order)
    best: list[tuple[int, int, tuple[int, int]] | None] = [None] * (n + 1)  # (runs, where the last starts, its ends)
    best[0] = (0, 0, (-1, -1))
    for hi in range(1, n + 1):
        for lo in range(max(0, hi - max_ops), hi):
            before = best[lo]
            if before is None or (best[hi] is not None and before[0] + 1 >= best[hi][0]):
                continue
            ends = _ends(graph, set(order[lo:hi]))
            if ends is not None:
                best[hi] = (before[0] + 1, lo, ends)
    out, hi = [], n
    while hi:
        _, lo, (first, last) = best[hi]  # type: ignore[misc]
        out.append((list(order[lo:hi]), first, last))
        hi = lo
    return out[::-1]


def split_groups(graph: OpGraph, groups: Sequence[dict[str, Any]], max_ops: int) -> list[dict[str, Any]]:
    """GROUPS.json entries (``forward_groups``' form) with every group of more than ``max_ops`` ops split
    (:func:`split_group`), renumbered in the order given (a group's pieces in their order); ``split_from``: the
    id of the group a piece came from."""
    index = {name: u for u, name in enumerate(graph.names)}
    out: list[dict[str, Any]] = []
    for group in groups:
        nodes = [index[n] for n in group["nodes"]]
        pieces = split_group(graph, nodes, index[group["input"]], index[group["output"]], max_ops)
        for members, first, last in pieces:
            entry = {"id": len(out), "nodes": [graph.names[u] for u in members], "input": graph.names[first],
                     "output": graph.names[last], "ops": [graph.ops[u] for u in members]}
            if len(pieces) > 1:
                entry["split_from"] = group["id"]
            out.append(entry)
    return out
