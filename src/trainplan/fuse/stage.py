"""The ``fuse`` rule's work on one exported model: groups, per-group table, baselines on the same mask."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from trainplan.fuse.baselines import fx_capability_groups, ort_wave_groups
from trainplan.fuse.coverage import coverage, group_table
from trainplan.fuse.exported import graph_from_export
from trainplan.fuse.graph import OpGraph
from trainplan.fuse.merge import contract_order
from trainplan.fuse.partitioner import Fusion, fuse_graph
from trainplan.fuse.support import SupportTable, support_masks


@dataclass
class StageResult:
    """What the rule writes: GROUPS document, per-group table, method comparison."""

    graph: OpGraph
    fusion: Fusion
    document: dict[str, Any]
    groups: pd.DataFrame
    compare: pd.DataFrame


def _padded(values: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=values.dtype)
    out[: len(values)] = values
    return out


def fuse_exported(nodes: pd.DataFrame, tensors: pd.DataFrame, ops: pd.DataFrame, table: SupportTable,
                  fx_max_nodes: int) -> StageResult:
    """Partition one exported step for ``table``; compare with ORT's waves and torch.fx's partitioner
    (the latter only up to ``fx_max_nodes`` ops: its proposal is slow on large graphs)."""
    graph = graph_from_export(nodes, tensors)
    time_s = _padded(nodes[["name"]].merge(ops[["name", "time_s"]], on="name", how="left")["time_s"]
                     .fillna(0.0).to_numpy(dtype=float), graph.n)
    supported, broken = support_masks(graph, table)
    fusion = fuse_graph(graph, supported, broken)
    groups = [list(g.nodes) for g in fusion.groups]
    rows = [{"method": "ours (1 input op, 1 output op)", "time_s": fusion.stats["time_s"],
             **coverage(groups, fusion.eligible, time_s)}]
    baselines = {"onnxruntime waves": ort_wave_groups}
    if graph.n <= fx_max_nodes:
        baselines["torch.fx CapabilityBasedPartitioner"] = fx_capability_groups
    for name, method in baselines.items():
        start = time.perf_counter()
        found = method(graph, fusion.eligible)
        elapsed = time.perf_counter() - start
        contract_order(graph, found)  # both are cycle-free by construction: checked anyway
        rows.append({"method": name, "time_s": elapsed, **coverage(found, fusion.eligible, time_s)})
    compare = pd.DataFrame(rows)
    ours = rows[0]
    compare["coverage_time_lost"] = compare["coverage_time"] - ours["coverage_time"]
    frame = nodes.set_index("name").reindex(graph.names).reset_index()
    frame["alloc_bytes"] = frame["alloc_bytes"].fillna(0).astype(np.int64)
    frame["is_view"] = frame["is_view"].fillna(False).astype(bool)
    frame[["phase", "module"]] = frame[["phase", "module"]].fillna("")
    table_df = group_table(graph, groups, [(g.input, g.output) for g in fusion.groups], frame, time_s)
    document = fusion.to_dict(graph)
    document["target"] = {"name": table.name, **table.source}
    document["baselines"] = compare.to_dict(orient="records")
    return StageResult(graph, fusion, document, table_df, compare)
