"""Per-stage statistics of a partition, computed directly from the graph (not from range tables)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from trainplan.partition.graph import PipelineGraph


@dataclass(frozen=True)
class StageStats:
    """One stage: its fx nodes (graph order), profiled times and the bytes it keeps and exchanges."""

    index: int
    nodes: list[str]
    forward_range: tuple[int, int]  # forward positions [start, end)
    time_s: float  # profiled forward + backward time
    forward_time_s: float
    backward_time_s: float
    activation_bytes: int  # stashed from forward to backward per micro-batch (received ones included)
    boundary_in_bytes: int  # non-fixed storages read here, allocated by another stage
    boundary_out_bytes: int  # storages allocated here, once per other stage that reads them
    fixed_bytes: int  # parameters, buffers and batch read by the stage's ops

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stage_index(cuts: tuple[int, ...], keys: np.ndarray) -> np.ndarray:
    """Stage of each forward position in ``keys`` for the cuts 0 = c_0 < ... < c_k = n."""
    return np.searchsorted(np.asarray(cuts[1:-1]), keys, side="right")


def _per_stage(k: int, stage: np.ndarray, storage: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Bytes per stage of the distinct storages each stage reads."""
    pairs = np.unique(np.stack([stage, storage]), axis=1)
    return np.bincount(pairs[0], weights=sizes[pairs[1]], minlength=k).astype(np.int64)


def stage_stats(graph: PipelineGraph, cuts: tuple[int, ...]) -> list[StageStats]:
    """Statistics of every stage of ``cuts`` (k + 1 forward positions from 0 to n_forward)."""
    k = len(cuts) - 1
    op_stage = stage_index(cuts, graph.key)
    read_stage = stage_index(cuts, graph.reads.key)
    prod_stage = stage_index(cuts, graph.producer_key)[graph.reads.storage]
    pairs = np.unique(np.stack([read_stage, graph.reads.storage, prod_stage]), axis=1)
    cross = pairs[:, pairs[0] != pairs[2]]
    sizes = graph.storage_bytes
    received = np.bincount(cross[0], weights=sizes[cross[1]], minlength=k).astype(np.int64)
    sent = np.bincount(cross[2], weights=sizes[cross[1]], minlength=k).astype(np.int64)
    stash = _per_stage(k, stage_index(cuts, graph.stash_reads.key), graph.stash_reads.storage, sizes)
    fixed = _per_stage(k, stage_index(cuts, graph.fixed_reads.key), graph.fixed_reads.storage, graph.fixed_bytes)
    out = []
    for s in range(k):
        mine = op_stage == s
        fwd, bwd = graph.time[mine & graph.forward].sum(), graph.time[mine & ~graph.forward].sum()
        out.append(StageStats(
            index=s,
            nodes=[name for name, m in zip(graph.names, mine) if m],
            forward_range=(int(cuts[s]), int(cuts[s + 1])),
            time_s=float(fwd + bwd),
            forward_time_s=float(fwd),
            backward_time_s=float(bwd),
            activation_bytes=int(stash[s]),
            boundary_in_bytes=int(received[s]),
            boundary_out_bytes=int(sent[s]),
            fixed_bytes=int(fixed[s]),
        ))
    return out
