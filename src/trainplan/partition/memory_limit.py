"""The per-stage memory a DP can evaluate exactly: parameters plus the schedule's in-flight activation stashes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainplan.partition.tables import RangeTables
from trainplan.schedule.pipeline_hold import in_flight


@dataclass(frozen=True)
class MemoryLimit:
    """Stage s of k over forward range [i, j) needs fixed[i, j] + in_flight(s) * stash[i, j] bytes.

    This is the memory a stage must hold with no recompute and no swap, before the activations of the
    micro-batch it is running; ``capacity_bytes`` is the device memory, shared evenly by the ``stages_per_rank``
    stages a device runs under a multi-stage schedule (a sufficient split: their needs summed fit it).
    """

    capacity_bytes: int
    micro_batches: int
    schedule: str = "1f1b"
    stages_per_rank: int = 1

    def need(self, tables: RangeTables, stage: int, k: int) -> np.ndarray:
        """(n+1) x (n+1) bytes needed by stage ``stage`` of ``k`` for every forward range."""
        n = in_flight(stage, k, self.micro_batches, self.schedule, self.stages_per_rank)
        return tables.fixed + n * tables.stash

    def admissible(self, tables: RangeTables, stage: int, k: int) -> np.ndarray:
        return self.need(tables, stage, k) <= self.capacity_bytes // self.stages_per_rank
