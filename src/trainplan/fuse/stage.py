"""The ``fuse`` rule's work on one model: its forward graph grouped by the seed's rule, the per-group table and the
baselines on the same mask.

The forward graph (``trace_forward``: parameters, buffers, batch -> loss) is what a training framework fuses: a
fused op is a forward kernel and autograd derives its backward (``trainplan.fuse.fused_ops``). Its ops carry the
names of the same ops in the exported training step, whose module paths and profiled times the table takes.
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from trainplan.fuse.baselines import fx_capability_groups, ort_wave_groups
from trainplan.fuse.coverage import coverage, group_table
from trainplan.fuse.forward import ForwardGraph, forward_groups
from trainplan.fuse.graph import OpGraph
from trainplan.fuse.inductor import tensors_of
from trainplan.fuse.merge import contract_order
from trainplan.fuse.partitioner import Fusion
from trainplan.fuse.support import GETITEM, SupportTable


@dataclass
class StageResult:
    """What the rule writes: GROUPS document, per-group table, method comparison."""

    graph: OpGraph
    fusion: Fusion
    document: dict[str, Any]
    groups: pd.DataFrame
    compare: pd.DataFrame


def grouping_result(graph: OpGraph, fusion: Fusion, frame: pd.DataFrame, time_s: np.ndarray, table: SupportTable,
                    fx_max_nodes: int) -> StageResult:
    """The grouping ``fusion`` of ``graph`` for ``table`` as the rule's outputs, compared with ORT's waves and
    torch.fx's partitioner on the same mask (the latter only up to ``fx_max_nodes`` ops: its proposal is slow on
    large graphs). ``frame``: per node of ``graph`` (``OUTPUT`` included) its ``op``, ``phase``, ``module``,
    ``alloc_bytes`` and ``is_view``; ``time_s``: its measured time."""
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
    compare["coverage_time_lost"] = compare["coverage_time"] - rows[0]["coverage_time"]
    table_df = group_table(graph, groups, [(g.input, g.output) for g in fusion.groups], frame, time_s)
    document = fusion.to_dict(graph)
    document["target"] = {"name": table.name, **table.source}
    document["baselines"] = compare.to_dict(orient="records")
    return StageResult(graph, fusion, document, table_df, compare)


def _alloc_bytes(node: torch.fx.Node) -> tuple[int, bool]:
    """Bytes a forward op's result allocates and whether it is a view (no storage of its own), from its value."""
    if node.target is operator.getitem or getattr(node.target, "is_view", False):
        return 0, True
    return sum(t.untyped_storage().nbytes() for t in tensors_of(node.meta.get("val"))), False


def forward_frame(fg: ForwardGraph, graph: OpGraph, export_nodes: pd.DataFrame, ops: pd.DataFrame
                  ) -> tuple[pd.DataFrame, np.ndarray, int]:
    """Per node of the forward graph's OpGraph: the exported step's row of the op with its name and op (module,
    phase, allocated bytes, view) and its profiled time; an op the step traced otherwise has its value's bytes, no
    module and no time. Also how many ops matched."""
    by_name = {n.name: n for n in fg.gm.graph.nodes}
    exported = export_nodes.set_index("name")
    time_of = dict(zip(ops["name"], ops["time_s"]))
    rows, times, matched = [], np.zeros(graph.n), 0
    for u, (name, op) in enumerate(zip(graph.names, graph.ops)):
        if op == "output":
            rows.append({"op": op, "phase": "", "module": "", "alloc_bytes": 0, "is_view": False})
            continue
        if name in exported.index and exported.at[name, "op"] == (op if op != GETITEM else "getitem"):
            row = exported.loc[name]
            rows.append({"op": op, "phase": "forward", "module": row["module"], "alloc_bytes": int(row["alloc_bytes"]),
                         "is_view": bool(row["is_view"])})
            times[u] = float(time_of.get(name, 0.0))
            matched += 1
            continue
        alloc, view = _alloc_bytes(by_name[name])
        rows.append({"op": op, "phase": "forward", "module": "", "alloc_bytes": alloc, "is_view": view})
    return pd.DataFrame(rows), np.nan_to_num(times), matched


def fuse_forward(fg: ForwardGraph, table: SupportTable, export_nodes: pd.DataFrame, ops: pd.DataFrame,
                 fx_max_nodes: int) -> StageResult:
    """The rule's result for one model and target: ``forward_groups`` (the partitioner and the independent
    checker on the forward graph) with the baselines and the per-group table, times from the step's profile
    (``export_nodes``, ``ops``: the exported step and its profile). The document says which graph was grouped."""
    graph, fusion, _ = forward_groups(fg, table)
    frame, time_s, matched = forward_frame(fg, graph, export_nodes, ops)
    result = grouping_result(graph, fusion, frame, time_s, table, fx_max_nodes)
    result.document["graph"] = {"grouped": "forward", "ops": graph.n - 1, "ops_in_exported_step": matched}
    return result
