"""The partitions a user would otherwise get, as forward-position cuts of a pipeline graph, to schedule and run
beside ours (the balance rule's, :func:`~trainplan.partition.balance.balance`):

- ``even_blocks``: the blocks split evenly (Megatron-style layers per stage; the first stages take one more when
  k does not divide them), ``pre`` with the first stage, ``post`` with the last;
- ``ds_uniform``: DeepSpeed's ``partition_method="uniform"``, its layer list (``pre``, blocks, ``post``) split into
  parts of nearly equal layer counts (``deepspeed.runtime.utils.partition_uniform``: the first parts one more);
- ``ds_parameters``: DeepSpeed's ``partition_method="parameters"``, the layers' parameter counts split by its
  linear-partition DP (``partition_balanced``: the split of the smallest max - min part sum found prefix by
  prefix, ties to the latest split);
- ``exact_dp``: the exact min-max split of the profiled op times over every forward position (PipeDream's
  planner, :func:`~trainplan.partition.split.min_max_cuts`).

DeepSpeed is not a dependency: its two rules are written here from its documented behaviour, over the layers of
:mod:`~trainplan.partition.layers`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trainplan.partition.errors import PartitionError
from trainplan.partition.graph import PipelineGraph
from trainplan.partition.layers import Layers
from trainplan.partition.memory_limit import MemoryLimit
from trainplan.partition.split import min_max_cuts
from trainplan.partition.tables import RangeTables

METHODS = ("even_blocks", "ds_uniform", "ds_parameters", "exact_dp")


def uniform_parts(items: int, parts: int) -> list[int]:
    """Boundaries of ``items`` split into ``parts`` of nearly equal counts, the first ``items % parts`` one
    larger (DeepSpeed's ``partition_uniform``)."""
    if items < parts:
        raise PartitionError(f"{items} layers cannot fill {parts} stages")
    chunk, extra = divmod(items, parts)
    return [p * chunk + min(p, extra) for p in range(parts + 1)]


def balanced_parts(weights: Sequence[float], parts: int) -> list[int]:
    """Boundaries of ``weights`` split into ``parts`` contiguous non-empty parts by DeepSpeed's
    ``partition_balanced`` rule: for every prefix and part count, keep the split whose part sums have the smallest
    max - min (ties: the latest split point), extending the kept split of shorter prefixes."""
    n = len(weights)
    if n < parts:
        raise PartitionError(f"{n} layers cannot fill {parts} stages")
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(weights, dtype=float))])
    cost = np.full((n + 1, parts + 1), np.inf)
    high = np.full((n + 1, parts + 1), np.inf)
    low = np.full((n + 1, parts + 1), np.inf)
    choice = np.zeros((n + 1, parts + 1), dtype=np.int64)
    cost[0, 0] = high[0, 0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, parts) + 1):
            for s in range(j - 1, i):
                if not np.isfinite(cost[s, j - 1]):
                    continue
                part = prefix[i] - prefix[s]
                hi, lo = max(high[s, j - 1], part), min(low[s, j - 1], part)
                if hi - lo <= cost[i, j]:
                    cost[i, j], high[i, j], low[i, j], choice[i, j] = hi - lo, hi, lo, s
    bounds = [n]
    for j in range(parts, 0, -1):
        bounds.append(int(choice[bounds[-1], j]))
    return bounds[::-1]


def even_blocks(layers: Layers, k: int) -> list[int]:
    """Layer boundaries of the blocks split evenly (``pre`` with the first stage, ``post`` with the last)."""
    blocks = layers.blocks
    bounds = uniform_parts(len(blocks), k)
    return [0, *(blocks[b] for b in bounds[1:-1]), len(layers.names)]


def method_cuts(method: str, k: int, *, graph: PipelineGraph, tables: RangeTables, layers: Layers | str,
                memory: MemoryLimit | None = None) -> tuple[int, ...]:
    """Forward-position cuts of ``method`` (one of METHODS) into ``k`` stages (``layers``: the model's, or why it has
    none); raises PartitionError naming the method when it cannot make ``k`` stages."""
    if method not in METHODS:
        raise PartitionError(f"unknown partition method '{method}' (known: {', '.join(METHODS)})")
    try:
        if method == "exact_dp":
            names = tuple(graph.names[i] for i in np.flatnonzero(graph.forward))
            return min_max_cuts(graph.position_weights(graph.time), k, tables, memory, names, graph.cut_ok)
        if isinstance(layers, str):
            raise PartitionError(layers)
        if method == "even_blocks":
            return layers.cuts(even_blocks(layers, k))
        if method == "ds_uniform":
            return layers.cuts(uniform_parts(len(layers.names), k))
        return layers.cuts(balanced_parts(layers.parameters, k))
    except PartitionError as exc:
        raise PartitionError(f"partition method '{method}', k={k}: {exc}") from None
