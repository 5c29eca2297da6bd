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
fewest pieces); a segment larger than ``max_ops`` is a piece alone. Only the maximality the seed's merge gives
is given up, and only for unions larger than ``max_ops`` (``check_grouping``'s ``max_ops``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainplan.fuse.graph import OpGraph

#: the default cap (config ``fuse.fused_ops.max_ops``): leaves GPT-2's groups (at most 23 forward ops: an MLP block)
#: and Llama's whole and cuts ResNet-50's trunk (228 ops) into its residual blocks (13-16 ops); a lower cap cuts
#: nothing more there (a block has no cut inside) but would cut GPT-2's blocks where they have cuts
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
    input op, output op)`` of at most ``max_ops`` ops where its cuts allow; itself when it has at most ``max_ops``."""
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
        pieces.append(([u for u in nodes if u in inside], bounds[at][1], bounds[end][2]))
        at = end
    return pieces


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
