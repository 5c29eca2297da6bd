"""Split into k contiguous stages by (weighted) time, then fine-tune the cuts for fewer boundary bytes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainplan.partition.errors import PartitionError
from trainplan.partition.graph import PipelineGraph
from trainplan.partition.memory_limit import MemoryLimit
from trainplan.partition.refine import Move, Refined, bottleneck, refine_cuts
from trainplan.partition.split import min_max_cuts
from trainplan.partition.stages import StageStats, stage_stats
from trainplan.partition.tables import RangeTables


@dataclass(frozen=True)
class Partition:
    """A partition: the min-max split, its refinement and the resulting stages."""

    split_cuts: tuple[int, ...]
    refined: Refined
    stages: list[StageStats]
    weighted_times: list[float]  # per stage, in the weights the split used (profiled time at first)

    @property
    def cuts(self) -> tuple[int, ...]:
        return self.refined.cuts

    @property
    def k(self) -> int:
        return len(self.stages)

    def to_dict(self) -> dict[str, Any]:
        r = self.refined
        return {
            "k": self.k,
            "cuts": list(self.cuts),
            "split_cuts": list(self.split_cuts),
            "bottleneck_s": max(s.time_s for s in self.stages),
            "boundary_bytes": sum(s.boundary_in_bytes for s in self.stages),
            "refinement": {"start_bytes": r.start_bytes, "end_bytes": r.end_bytes, "weight_limit": r.limit,
                           "moves": [vars(m) for m in r.moves]},
            "stages": [{**s.to_dict(), "n_nodes": len(s.nodes), "weighted_time": w} for s, w in zip(self.stages, self.weighted_times)],
        }


def partition_graph(graph: PipelineGraph, tables: RangeTables, k: int, *, tolerance: float,
                    weights: np.ndarray | None = None, memory: MemoryLimit | None = None) -> Partition:
    """Min-max split of ``weights`` (per op, default profiled time) into ``k`` stages, then refinement.

    Raises PartitionError when k is not in 1..n_forward or no split meets ``memory``.
    """
    op_weights = graph.time if weights is None else weights
    pos = graph.position_weights(op_weights)
    names = tuple(graph.names[i] for i in np.flatnonzero(graph.forward))
    split = min_max_cuts(pos, k, tables, memory, names, graph.cut_ok)
    refined = refine_cuts(graph, tables, pos, split, tolerance, memory)
    prefix = np.concatenate([[0.0], np.cumsum(pos)])
    weighted = [float(prefix[b] - prefix[a]) for a, b in zip(refined.cuts, refined.cuts[1:])]
    return Partition(split, refined, stage_stats(graph, refined.cuts), weighted)


def cuts_bottleneck(graph: PipelineGraph, cuts: tuple[int, ...]) -> float:
    """Largest profiled stage time of ``cuts``."""
    return bottleneck(np.concatenate([[0.0], np.cumsum(graph.position_weights(graph.time))]), cuts)


def partition_from_dict(graph: PipelineGraph, data: dict[str, Any]) -> Partition:
    """Read back :meth:`Partition.to_dict`; raises PartitionError if it does not match ``graph``."""
    cuts = tuple(int(c) for c in data["cuts"])
    if len(cuts) < 2 or cuts[0] != 0 or cuts[-1] != graph.n_forward or any(a >= b for a, b in zip(cuts, cuts[1:])):
        raise PartitionError(f"partition cuts {list(cuts)} are not increasing from 0 to {graph.n_forward}")
    stats = stage_stats(graph, cuts)
    for stage, record in zip(stats, data["stages"]):
        if stage.nodes != record["nodes"]:
            raise PartitionError(f"stage {stage.index} of the partition does not match the graph: rebuild it")
    r = data["refinement"]
    refined = Refined(cuts, r["start_bytes"], r["end_bytes"], r["weight_limit"], [Move(**m) for m in r["moves"]])
    return Partition(tuple(data["split_cuts"]), refined, stats, [s["weighted_time"] for s in data["stages"]])
