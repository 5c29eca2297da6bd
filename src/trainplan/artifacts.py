"""Read and write the exported graph and profile artifacts (layout in docs/artifacts.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainplan.errors import ArtifactError
from trainplan.io import read_json, read_table, write_json, write_table

NODE_COLUMNS = ["node_id", "name", "op", "module", "phase", "inputs", "outputs", "alloc_bytes", "is_view", "flops"]
TENSOR_COLUMNS = ["tensor_id", "node", "shape", "dtype", "bytes", "storage", "storage_bytes", "kind", "is_graph_output"]
PROFILE_COLUMNS = ["name", "time_s", "recompute_s", "transfer_s", "workspace_measured_bytes"]


@dataclass
class Graph:
    """An exported graph with its per-op profile merged in when one is given."""

    nodes: pd.DataFrame
    tensors: pd.DataFrame
    summary: dict[str, Any]


def read_graph(nodes_path: str | Path, tensors_path: str | Path, summary_path: str | Path) -> Graph:
    """Load an exported graph, checking its columns and that every input names a known tensor."""
    nodes = read_table(nodes_path, NODE_COLUMNS)
    tensors = read_table(tensors_path, TENSOR_COLUMNS)
    summary = read_json(summary_path)
    known = set(tensors.tensor_id)
    for row in nodes.itertuples():
        dangling = [t for t in list(row.inputs) + list(row.outputs) if t not in known]
        if dangling:
            raise ArtifactError(f"{nodes_path}: node '{row.name}' refers to unknown tensor(s) {dangling[:3]}")
    return Graph(nodes, tensors, summary)


def with_measured_workspaces(nodes: pd.DataFrame) -> pd.DataFrame:
    """``nodes`` (an op table merged with its profile's ``workspace_measured_bytes``) with ``workspace_bytes``
    the larger of the two: the computed workspace of trainplan's own ops (export) or an update's
    (``loop.updates``), and the measured one of every op."""
    out = nodes.copy()
    computed = out["workspace_bytes"].to_numpy(dtype=np.int64) if "workspace_bytes" in out else 0
    out["workspace_bytes"] = np.maximum(computed, out["workspace_measured_bytes"].to_numpy(dtype=np.int64))
    return out


def read_profiled_graph(nodes_path: str | Path, tensors_path: str | Path, summary_path: str | Path, profile_path: str | Path) -> Graph:
    """Load a graph and merge the per-op profile (time_s, recompute_s, transfer_s, workspace_measured_bytes) into
    its nodes; an op's ``workspace_bytes`` is then the larger of the computed and the measured one."""
    graph = read_graph(nodes_path, tensors_path, summary_path)
    prof = read_table(profile_path, PROFILE_COLUMNS)
    merged = graph.nodes.merge(prof[PROFILE_COLUMNS], on="name", how="left", validate="one_to_one")
    missing = merged.loc[merged.time_s.isna(), "name"].tolist()
    if missing:
        raise ArtifactError(f"{profile_path} has no timing for op(s) {missing[:5]} of {nodes_path}: profile and graph disagree")
    graph.nodes = with_measured_workspaces(merged)
    return graph


def read_host_link(profile_summary_path: str | Path) -> float:
    """The host-link bandwidth (bytes/s) the profile costed transfers with: configured or measured."""
    summary = read_json(profile_summary_path)
    value = summary.get("host_link_bytes_per_s")
    if not isinstance(value, (int, float)) or value <= 0:
        raise ArtifactError(f"{profile_summary_path}: no positive 'host_link_bytes_per_s'; re-run the profile rule")
    return float(value)


def read_host_link_sizes(profile_summary_path: str | Path) -> list[int] | None:
    """The transfer sizes (bytes) the profile measured the host link on; None when it was configured, not
    measured (or measured before the sizes were recorded)."""
    sizes = read_json(profile_summary_path).get("host_link", {}).get("sizes")
    if sizes is None:
        return None
    if not (isinstance(sizes, list) and all(isinstance(s, int) and s >= 0 for s in sizes)):
        raise ArtifactError(f"{profile_summary_path}: 'host_link.sizes' is not a list of byte counts; re-run the profile rule")
    return sizes


def write_graph(nodes_path: str | Path, tensors_path: str | Path, summary_path: str | Path, nodes: pd.DataFrame, tensors: pd.DataFrame, summary: dict[str, Any]) -> None:
    """Write the three graph artifacts atomically."""
    write_table(nodes_path, nodes)
    write_table(tensors_path, tensors)
    write_json(summary_path, summary)
