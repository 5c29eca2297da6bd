"""Exact min-max (bottleneck) contiguous split by dynamic programming, as PipeDream's planner does."""

from __future__ import annotations

import numpy as np

from trainplan.partition.errors import PartitionError
from trainplan.partition.memory_limit import MemoryLimit
from trainplan.partition.tables import RangeTables


def _range_costs(prefix: np.ndarray) -> np.ndarray:
    """cost[i, j] = prefix[j] - prefix[i] for i < j, +inf elsewhere."""
    n = len(prefix) - 1
    cost = prefix[None, :] - prefix[:, None]
    cost[np.tril_indices(n + 1)] = np.inf
    return cost


def min_max_cuts(position_weights: np.ndarray, k: int, tables: RangeTables | None = None,
                 memory: MemoryLimit | None = None, names: tuple[str, ...] = (),
                 allowed: np.ndarray | None = None) -> tuple[int, ...]:
    """Cuts 0 = c_0 < c_1 < ... < c_k = n of the forward positions minimising the largest stage weight.

    Stage s is [c_s, c_{s+1}); with ``memory`` (and ``tables``) a stage is admissible only if its need
    fits the capacity; with ``allowed`` (bool per cut position, ``PipelineGraph.cut_ok``) a cut falls only where
    it is True. Ties go to the earliest cut. O(k n^2). ``names`` (forward op names) only improve the error
    raised when no admissible split exists.
    """
    n = len(position_weights)
    if k < 1:
        raise PartitionError(f"stage count k={k} must be at least 1")
    if k > n:
        raise PartitionError(f"stage count k={k} exceeds the {n} forward ops: a stage needs at least one")
    if allowed is not None and int(allowed[1:n].sum()) < k - 1:
        raise PartitionError(f"stage count k={k} needs {k - 1} cuts, but only {int(allowed[1:n].sum())} forward "
                             "positions start an op that is not a view of the op before")
    prefix = np.concatenate([[0.0], np.cumsum(position_weights)])
    cost = _range_costs(prefix)
    if allowed is not None:
        cost[:, ~allowed] = np.inf
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    choice = np.zeros((k, n + 1), dtype=np.int64)
    for s in range(k):
        step = np.maximum(best[:, None], cost)
        if memory is not None and tables is not None:
            step[~memory.admissible(tables, s, k)] = np.inf
        choice[s] = np.argmin(step, axis=0)
        best = step[choice[s], np.arange(n + 1)]
        ends = [n] if s == k - 1 else range(s + 1, n - (k - 1 - s) + 1)  # room for the later stages
        if not np.isfinite(best[list(ends)]).any():
            raise _no_fit(tables, memory, s, k, names)
    cuts = [n]
    for s in range(k - 1, 0, -1):
        cuts.append(int(choice[s][cuts[-1]]))
    return (0, *reversed(cuts))


def _no_fit(tables: RangeTables | None, memory: MemoryLimit | None, stage: int, k: int,
            names: tuple[str, ...]) -> PartitionError:
    """The error for a stage no admissible range can hold, with the least it would need."""
    assert tables is not None and memory is not None  # without a memory limit every split is admissible
    n = len(tables.fixed) - 1
    starts = np.array([0] if stage == 0 else range(stage, n))
    ends = np.array([n] if stage == k - 1 else range(stage + 1, n - (k - 1 - stage) + 1))
    need = memory.need(tables, stage, k)[np.ix_(starts, ends)].astype(float)
    need[starts[:, None] >= ends[None, :]] = np.inf
    row, _ = np.unravel_index(int(np.argmin(need)), need.shape)
    where = f" (its cheapest range starts at forward node '{names[starts[row]]}')" if names else ""
    return PartitionError(
        f"no split into k={k} stages fits the memory limit of {memory.capacity_bytes} B: stage {stage} "
        f"(holding up to {min(k - stage, memory.micro_batches)} micro-batches) needs at least "
        f"{int(need.min())} B{where}")
