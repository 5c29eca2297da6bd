"""Schedule one stage under its memory budget (stage_problem + budget_for + solve), cached by node list."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd

from trainplan.partition.errors import PartitionError
from trainplan.schedule.problem import problem_from_dict
from trainplan.schedule.schedule_io import Schedule
from trainplan.schedule.solve import solve
from trainplan.stage_problem import budget_for, stage_problem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SolverSettings:
    time_limit_s: float
    workers: int
    seed: int


@dataclass(frozen=True)
class ScheduledStage:
    problem: dict[str, Any]  # stage_problem's dict with budget_bytes set
    schedule: Schedule
    seconds: float  # wall time of building and solving


class StageScheduler:
    """Schedules stages of one profiled graph at one budget fraction; identical stages are solved once."""

    def __init__(self, nodes: pd.DataFrame, tensors: pd.DataFrame, *, bandwidth: float,
                 budget_fraction: float, solver: SolverSettings) -> None:
        if not 0.0 < budget_fraction <= 1.0:
            raise PartitionError(f"budget fraction {budget_fraction} must be in (0, 1]")
        self.nodes, self.tensors = nodes, tensors
        self.bandwidth, self.fraction, self.solver = bandwidth, budget_fraction, solver
        self._cache: dict[tuple[str, ...], ScheduledStage] = {}

    @property
    def solved(self) -> int:
        return len(self._cache)

    def __call__(self, index: int, stage_nodes: list[str]) -> ScheduledStage:
        """The stage's problem and schedule; raises PartitionError naming the stage if none meets a budget."""
        key = tuple(stage_nodes)
        if key not in self._cache:
            t0 = time.perf_counter()
            problem = stage_problem(self.nodes, self.tensors, stage_nodes, bandwidth=self.bandwidth)
            problem["budget_bytes"] = budget_for(problem, self.fraction)
            s = self.solver
            sched = solve(problem_from_dict(problem), s.time_limit_s, s.workers, s.seed)
            if not sched.ok:
                raise PartitionError(
                    f"stage {index} ({len(stage_nodes)} nodes, first '{stage_nodes[0]}'): no schedule meets "
                    f"budget {problem['budget_bytes']} B ({self.fraction} of its peak): {sched.extra.get('note')}")
            self._cache[key] = ScheduledStage(problem, sched, time.perf_counter() - t0)
            log.info("stage %d: %d nodes, budget %d B, %s time %.4f s (%.1f s)", index, len(stage_nodes),
                     problem["budget_bytes"], sched.status, sched.time, self._cache[key].seconds)
        return self._cache[key]
