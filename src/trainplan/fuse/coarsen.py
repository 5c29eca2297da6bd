"""The fused graph as the coarser graph for planning: every fusion group of >= 2 ops becomes one node.

A pass from the exported step (``nodes``/``tensors`` tables and the profile's ``ops``) to the same tables
on the contracted graph, so partition, schedule, balance and validate run on it unchanged. A group node
``fused_<id>``:

- reads the tensors its members read that no member makes (only its input op reads other ops' tensors);
- makes every tensor of its members except those on *internal* storages: storages its members allocate
  that nothing outside the group reads and that are not graph outputs. Those are dropped from the tensor
  table, listed under ``internal_storages`` and counted in
  ``internal_bytes``, which the stage problem holds as the op's workspace while it runs (the executor
  runs the members op by op and frees their internal storages at the end of the op's compute);
- takes the phase and module of its input op (a group of forward ops with the ``detach`` views backward
  reads runs in forward), the sum of its members' profiled times (what running them costs), and, when
  the group was compiled and timed (``fuse_measure``), ``fused_s``: that time scaled by the measured
  fused/unfused ratio, the time a fused kernel would take;
- lists its members (``members``, in graph order) and their ops (``member_ops``: in-place and random
  members decide what the plan may do with the node, as for a raw op).

The node sits at its input op's row: an edge into a single-input/single-output group ends at its input
op and an edge out of it starts at its output op, so the table order stays topological.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from trainplan.fuse.errors import FuseError

PREFIX = "fused_"


@dataclass
class CoarseGraph:
    """The contracted step: export-format ``nodes``/``tensors``, the profile ``ops`` and counts."""

    nodes: pd.DataFrame
    tensors: pd.DataFrame
    ops: pd.DataFrame
    stats: dict[str, Any] = field(default_factory=dict)


def _fused_ratio(measured: pd.DataFrame | None) -> dict[int, float]:
    """group id -> fused_s / unfused_s, for the groups compiled and timed."""
    if measured is None or measured.empty:
        return {}
    ok = measured[(measured.unfused_s > 0) & measured.fused_s.notna()]
    return {int(g): float(f / u) for g, f, u in zip(ok.group, ok.fused_s, ok.unfused_s)}


def coarsen(nodes: pd.DataFrame, tensors: pd.DataFrame, ops: pd.DataFrame, groups: list[dict[str, Any]],
            measured: pd.DataFrame | None = None) -> CoarseGraph:
    """Contract every group of >= 2 ops of ``groups`` (GROUPS.json ``groups``) into one node.

    ``ops`` is the profile table (``name``, ``time_s``, ...); ``measured`` the ``fuse_measure`` table
    (``group``, ``unfused_s``, ``fused_s``), optional. A group naming a node the graph lacks raises
    FuseError naming both.
    """
    index = {name: i for i, name in enumerate(nodes["name"])}
    multi = [g for g in groups if len(g["nodes"]) >= 2]
    group_of: dict[str, int] = {}
    for g in multi:
        for name in g["nodes"]:
            if name not in index:
                raise FuseError(f"fusion group {g['id']}: node '{name}' is not in the exported graph")
            group_of[name] = int(g["id"])
    taken = set(nodes["name"])
    for g in multi:
        if f"{PREFIX}{g['id']}" in taken:
            raise FuseError(f"fusion group {g['id']}: the graph already has a node named '{PREFIX}{g['id']}'")
    storage_of = dict(zip(tensors.tensor_id, tensors.storage))
    producer = tensors.drop_duplicates("storage").set_index("storage")["node"].to_dict()
    readers: dict[int, set[str]] = {}
    for name, ins in zip(nodes["name"], nodes["inputs"]):
        for tid in ins:
            readers.setdefault(storage_of[tid], set()).add(name)
    outputs = set(tensors.loc[tensors.is_graph_output.astype(bool), "storage"])
    size = dict(zip(tensors.storage, tensors.storage_bytes))
    time_of = dict(zip(ops["name"], ops["time_s"]))
    ratio = _fused_ratio(measured)

    rows = nodes.set_index("name")
    internal: set[int] = set()
    coarse_rows: dict[str, dict[str, Any]] = {}  # input op name -> the group's row
    for g in multi:
        members = sorted(g["nodes"], key=index.__getitem__)
        inside = set(members)
        made = {s for s, p in producer.items() if p in inside}
        hidden = sorted(s for s in made if s not in outputs and readers.get(s, set()) <= inside)
        internal.update(hidden)
        member_outputs = {t for m in members for t in rows.at[m, "outputs"]}
        first = rows.loc[members[0]]
        gid = int(g["id"])
        time_s = float(sum(time_of[m] for m in members))
        coarse_rows[members[0]] = {
            "node_id": first["node_id"], "name": f"{PREFIX}{gid}", "op": "trainplan.fused",
            "module": first["module"], "phase": first["phase"],
            "inputs": list(dict.fromkeys(t for m in members for t in rows.at[m, "inputs"] if t not in member_outputs)),
            "outputs": [t for m in members for t in rows.at[m, "outputs"] if storage_of[t] not in hidden],
            "input_nodes": list(dict.fromkeys(n for m in members for n in rows.at[m, "input_nodes"] if n not in inside)),
            "alloc_bytes": int(sum(size[s] for s in made if s not in hidden)),
            "is_view": bool(all(rows.at[m, "is_view"] for m in members)),
            "flops": float(sum(rows.at[m, "flops"] for m in members)),
            "members": members, "member_ops": [str(rows.at[m, "op"]) for m in members],
            "internal_storages": hidden, "internal_bytes": int(sum(size[s] for s in hidden)),
            "group": gid, "time_s": time_s, "fused_s": time_s * ratio[gid] if gid in ratio else np.nan,
        }
    return _assemble(nodes, tensors, ops, group_of, coarse_rows, internal)


def _assemble(nodes: pd.DataFrame, tensors: pd.DataFrame, ops: pd.DataFrame, group_of: dict[str, int],
              coarse_rows: dict[str, dict[str, Any]], internal: set[int]) -> CoarseGraph:
    """The coarse tables: raw rows of ungrouped nodes, a group's row at its input op, internal tensors gone."""
    rename = {m: r["name"] for r in coarse_rows.values() for m in r["members"]}
    node_columns = [*nodes.columns, "members", "member_ops", "internal_storages", "internal_bytes"]
    sums = [c for c in ops.columns if c not in ("name", "node_id", "phase") and pd.api.types.is_numeric_dtype(ops[c])]
    profile = ops.set_index("name")
    node_rows, op_rows = [], []
    for row in nodes.to_dict("records"):
        name = row["name"]
        if name in coarse_rows:
            group_row = coarse_rows[name]
            members = group_row["members"]
            node_rows.append({c: group_row[c] for c in node_columns})
            op_rows.append({"name": group_row["name"], "phase": group_row["phase"],
                            **{c: float(profile.loc[members, c].sum()) for c in sums},
                            "fused_s": group_row["fused_s"], "group": group_row["group"], "n_ops": len(members)})
        elif name not in group_of:
            node_rows.append({**row, "members": None, "member_ops": None, "internal_storages": None, "internal_bytes": 0})
            op_rows.append({**profile.loc[name].to_dict(), "name": name, "fused_s": np.nan, "group": -1, "n_ops": 1})
    coarse_nodes = pd.DataFrame(node_rows)
    coarse_nodes["input_nodes"] = [[rename.get(n, n) for n in ins] for ins in coarse_nodes["input_nodes"]]
    kept = tensors[~tensors.storage.isin(internal)].copy()
    kept["node"] = [rename.get(n, n) for n in kept["node"]]
    coarse_ops = pd.DataFrame(op_rows)
    coarse_ops["node_id"] = coarse_nodes["node_id"].to_numpy()
    stats = {
        "ops_raw": int(len(nodes)), "ops_coarse": int(len(coarse_nodes)), "groups_contracted": len(coarse_rows),
        "members": len(group_of), "internal_storages": len(internal),
        "internal_bytes": int(sum(r["internal_bytes"] for r in coarse_rows.values())),
        "groups_timed_fused": int(sum(1 for r in coarse_rows.values() if not np.isnan(r["fused_s"]))),
    }
    return CoarseGraph(coarse_nodes, kept.reset_index(drop=True), coarse_ops, stats)
