"""Schedule one stage under its memory budget for the balance loop, cached by node list."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd

from trainplan.budget import Budget, parse_budget
from trainplan.partition.errors import PartitionError
from trainplan.schedule.budgeted_stages import SolverSettings, StageBudget, schedule_stage
from trainplan.schedule.pipeline_hold import PipelineHold
from trainplan.schedule.schedule_io import Schedule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScheduledStage:
    problem: dict[str, Any]  # the budgeted stage problem dict
    schedule: Schedule
    seconds: float  # wall time of building and solving (0 for a schedule reused from the schedule rule)


class StageScheduler:
    """Schedules stages of one profiled graph at one budget (bytes or a fraction: ``parse_budget``, whose
    BudgetError names a bad one; ``swap``: whether ops may be swapped; ``pipeline``: the pipeline the stages run
    in, whose in-flight stashes and gradient sums the budget holds; ``allocation``: the device type whose
    allocation sizes weigh storages, ``StageBudget``); identical stages at the same position are
    solved once."""

    def __init__(self, nodes: pd.DataFrame, tensors: pd.DataFrame, *, bandwidth: float,
                 budget: Budget | str | int | float, solver: SolverSettings, swap: bool = True,
                 pipeline: PipelineHold | None = None, allocation: str | None = None) -> None:
        self.nodes, self.tensors = nodes, tensors
        self.budget, self.solver = StageBudget(parse_budget(budget), bandwidth, swap, pipeline, allocation), solver
        self._cache: dict[tuple[int, tuple[str, ...]], ScheduledStage] = {}
        self.reused = 0

    @property
    def schedule(self) -> str:
        """The pipeline schedule the stages are planned for (1F1B without a pipeline)."""
        return self.budget.pipeline.schedule if self.budget.pipeline is not None else "1f1b"

    @property
    def stages_per_rank(self) -> int:
        """The stages each rank runs under that schedule."""
        return self.budget.pipeline.stages_per_rank if self.budget.pipeline is not None else 1

    @property
    def solved(self) -> int:
        return len(self._cache) - self.reused

    def reuse(self, index: int, stage_nodes: list[str], problem: dict[str, Any], schedule: Schedule) -> None:
        """Take stage ``index``'s schedule solved elsewhere (the schedule rule) with the same settings."""
        self._cache[(index, tuple(stage_nodes))] = ScheduledStage(problem, schedule, 0.0)
        self.reused += 1

    def __call__(self, index: int, stage_nodes: list[str]) -> ScheduledStage:
        """The stage's problem and schedule; raises PartitionError naming the stage if none meets a budget."""
        key = (index, tuple(stage_nodes))
        if key not in self._cache:
            t0 = time.perf_counter()
            problem, sched = schedule_stage(self.nodes, self.tensors, stage_nodes, budget=self.budget,
                                            solver=self.solver, index=index)
            self._cache[key] = ScheduledStage(problem, sched, time.perf_counter() - t0)
            log.info("stage %d: %d nodes, budget %d B, %s time %s s (%.1f s)", index, len(stage_nodes),
                     problem["budget_bytes"], sched.status, sched.time, self._cache[key].seconds)
        hit = self._cache[key]
        if not hit.schedule.ok:
            raise PartitionError(
                f"stage {index} ({len(stage_nodes)} nodes, first '{stage_nodes[0]}'): no schedule meets "
                f"budget {hit.problem['budget_bytes']} B (requested: {self.budget.requested}): {hit.schedule.extra.get('note')}")
        return hit
