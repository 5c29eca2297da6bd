"""The fusion partitioner: device regions, library split, the seed's pruning, maximal merge, DAG check."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainplan.fuse.graph import OpGraph
from trainplan.fuse.merge import contract_order, merge_groups
from trainplan.fuse.prune import components, input_ops, output_ops, prune


@dataclass(frozen=True)
class Group:
    """A target subgraph: its members (topological order), its one input op and one output op."""

    nodes: tuple[int, ...]
    input: int
    output: int


@dataclass
class Fusion:
    """Groups (every eligible node in exactly one; singletons included) and how they were found."""

    groups: list[Group]
    supported: list[bool]
    eligible: list[bool]  # supported and passing every library rule
    broken: dict[int, str]  # supported nodes a library rule rejected, with the reason
    stats: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, graph: OpGraph) -> dict[str, Any]:
        """The documented GROUPS.json form (names instead of indices)."""
        name = graph.names
        return {
            "groups": [{"id": k, "nodes": [name[u] for u in g.nodes], "input": name[g.input], "output": name[g.output],
                        "ops": [graph.ops[u] for u in g.nodes]} for k, g in enumerate(self.groups)],
            "host_nodes": [name[u] for u in graph.order if not self.eligible[u]],
            "rejected": {name[u]: why for u, why in sorted(self.broken.items())},
            "contracted_is_dag": self.stats["contracted_is_dag"],
            "stats": self.stats,
        }


def fuse_graph(graph: OpGraph, supported: Sequence[bool], broken: dict[int, str] | None = None,
               merge: bool = True) -> Fusion:
    """Partition ``graph`` into single-input/single-output groups of supported ops (seed 002).

    1. device support: maximal weakly connected regions of supported nodes;
    2. library rules: nodes in ``broken`` leave their region, which splits into its connected parts;
    3. pruning (``prune``): each part into pieces with one input op and one output op;
    4. ``merge``: adjacent groups merged while the union keeps one input op and one output op, until no
       pair can be merged (maximality);
    5. contraction of every group must leave a DAG (``contract_order`` raises FuseError otherwise).
    """
    start = time.perf_counter()
    broken = dict(broken or {})
    eligible = [bool(s) and u not in broken for u, s in enumerate(supported)]
    position = [0] * graph.n
    for rank, u in enumerate(graph.order):
        position[u] = rank
    regions = components(graph, (u for u in range(graph.n) if supported[u]))
    parts = [c for r in regions for c in components(graph, (u for u in r if eligible[u]))]
    pieces: list[list[int]] = []
    rounds = 0
    for part in parts:
        found, r = prune(graph, part, position)
        pieces.extend(found)
        rounds += r
    pruned_at = time.perf_counter()
    ends = [_ends(graph, p) for p in pieces]
    groups, ends, merges = merge_groups(graph, pieces, ends, eligible) if merge else (pieces, ends, 0)
    merged_at = time.perf_counter()
    result = sorted((Group(tuple(sorted(g, key=position.__getitem__)), i, o) for g, (i, o) in zip(groups, ends)),
                    key=lambda g: position[g.input])
    contract_order(graph, [g.nodes for g in result])
    end = time.perf_counter()
    stats = {
        "n_nodes": graph.n, "n_supported": sum(map(bool, supported)), "n_eligible": sum(eligible),
        "n_rejected": len(broken), "device_regions": len(regions), "library_parts": len(parts),
        "pruned_pieces": len(pieces), "prune_rounds": rounds, "merges": merges, "groups": len(result),
        "groups_ge2": sum(len(g.nodes) >= 2 for g in result), "contracted_is_dag": True,
        "time_prune_s": pruned_at - start, "time_merge_s": merged_at - pruned_at, "time_check_s": end - merged_at,
        "time_s": end - start,
    }
    return Fusion(result, list(map(bool, supported)), eligible, broken, stats)


def _ends(graph: OpGraph, piece: Sequence[int]) -> tuple[int, int]:
    members = set(piece)
    (i,), (o,) = input_ops(graph, members), output_ops(graph, members)  # prune's pieces have one of each
    return i, o
