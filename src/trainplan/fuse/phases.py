"""Fusion groups of a training step as a training framework fuses it: the forward and the backward ops are
partitioned apart, each by the seed's rule, so a tensor the forward saves for the backward does not end a
forward group (what a fused op saves is its own business, as in ``fuse_train``).

Within each phase, the ops that compute something that phase uses (ops with a successor in the phase, or
producing a graph output, and what feeds them) are partitioned by ``fuse_graph``: groups with one input op and
one output op in the phase's subgraph, maximal, checked by the independent checker. The other ops of a phase
are the views and side effects the next phase alone reads (``detach`` and ``getitem`` of saved tensors, batch
norm's running-statistics updates); a view of one op joins that op's group, as the saved tensor it is. The
groups of both phases, contracted in the whole step, must leave a DAG (``contract_order`` raises otherwise):
edges between the phases run from forward to backward only.
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd

from trainplan.fuse.check import check_grouping
from trainplan.fuse.errors import FuseError
from trainplan.fuse.exported import graph_from_export
from trainplan.fuse.merge import contract_order
from trainplan.fuse.partitioner import fuse_graph
from trainplan.fuse.support import SupportTable, support_masks


def computing_ops(nodes: pd.DataFrame, output_nodes: set[str]) -> pd.DataFrame:
    """The rows of ``nodes`` (one phase) that compute something the phase uses: ops with a successor among the
    kept rows or producing a graph output (ops left without one are dropped until none is)."""
    kept = nodes
    while True:
        names = set(kept["name"])
        used = {src for ins in kept["input_nodes"] for src in ins if src in names}
        keep = kept["name"].isin(used | output_nodes)
        if keep.all():
            return kept
        kept = kept[keep]


def phase_groups(nodes: pd.DataFrame, tensors: pd.DataFrame, table: SupportTable) -> dict[str, Any]:
    """GROUPS.json-style document of the step's phase-wise grouping: ``groups`` (``id``, ``phase``, ``nodes`` in
    graph order, ``input``, ``output`` within the phase, ``saved_views``: the views that joined), ``stats`` per
    phase, ``contracted_is_dag``. Raises FuseError naming the phase and the problem where a check fails."""
    start = time.perf_counter()
    output_nodes = set(tensors.loc[tensors["is_graph_output"].astype(bool), "node"])
    index = {name: i for i, name in enumerate(nodes["name"])}
    groups: list[dict[str, Any]] = []
    stats: dict[str, Any] = {}
    for phase in dict.fromkeys(nodes["phase"]):
        rows = nodes[nodes["phase"] == phase]
        kept = computing_ops(rows, output_nodes)
        graph = graph_from_export(kept, tensors)
        supported, broken = support_masks(graph, table)
        fusion = fuse_graph(graph, supported, broken)
        doc = fusion.to_dict(graph)
        eligible = {graph.names[u] for u in range(graph.n) if fusion.eligible[u]}
        edges = [(graph.names[u], graph.names[v]) for u, v in graph.edges()]
        problems = check_grouping(graph.names, edges, eligible, doc["groups"], cycle_check_merges=graph.n <= 3000)
        if problems:
            raise FuseError(f"{phase} ops: the grouping violates the rule: {problems[:3]}")
        owner = {name: len(groups) + k for k, g in enumerate(doc["groups"]) for name in g["nodes"]}
        phase_groups_ = [{"id": len(groups) + k, "phase": phase, "nodes": list(g["nodes"]), "input": g["input"],
                          "output": g["output"], "saved_views": []} for k, g in enumerate(doc["groups"])]
        for row in rows[~rows["name"].isin(set(kept["name"]))].itertuples(index=False):
            ops_read = [n for n in dict.fromkeys(row.input_nodes) if n in index]
            if row.is_view and len(ops_read) == 1 and ops_read[0] in owner:
                gid = owner[ops_read[0]]
                owner[row.name] = gid
                phase_groups_[gid - len(groups)]["saved_views"].append(row.name)
        for g in phase_groups_:
            g["nodes"] = sorted(g["nodes"] + g["saved_views"], key=index.__getitem__)
        sizes = [len(g["nodes"]) for g in phase_groups_]
        stats[phase] = {"ops": len(rows), "computing_ops": len(kept), "groups_ge2": sum(s >= 2 for s in sizes),
                        "largest": max(sizes, default=0), "members": sum(s for s in sizes if s >= 2),
                        "saved_views": sum(len(g["saved_views"]) for g in phase_groups_),
                        "host_ops": len(kept) - len(eligible)}
        groups += phase_groups_
    whole = graph_from_export(nodes, tensors)
    position = {name: u for u, name in enumerate(whole.names)}
    contract_order(whole, [[position[n] for n in g["nodes"]] for g in groups])  # FuseError names a cycle's groups
    multi = [g for g in groups if len(g["nodes"]) >= 2]
    stats.update({"ops": len(nodes), "ops_coarse": len(nodes) - sum(len(g["nodes"]) for g in multi) + len(multi),
                  "time_s": time.perf_counter() - start})
    return {"scope": "phases", "groups": groups, "contracted_is_dag": True, "stats": stats}
