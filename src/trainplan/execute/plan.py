"""Read a plan (``results/balance/.../plan.json``) and check it, or build one in-process for k stages.

A plan is ``{"model", "device", "k", "budget_fraction", "stages": [{"index", "nodes", "problem",
"schedule"}]}``; each stage's problem is in the format of :mod:`trainplan.schedule` with ``nodes`` and
``storages`` on every op, and its schedule carries ``events``, ``time`` and ``peak_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from trainplan.budget import Budget
from trainplan.errors import ArtifactError
from trainplan.io import read_json
from trainplan.schedule import Problem, ProblemError, ScheduleError, problem_from_dict, replay, solve
from trainplan.schedule.grad_accumulation import held_alone
from trainplan.schedule.stage_problem import budget_for, stage_problem


class PlanError(ValueError):
    """A plan file is corrupt: unreadable, missing keys, or a stage whose problem or events are invalid."""


@dataclass
class StagePlan:
    """One stage of a plan: the fx nodes its ops run, raw problem dict, validated problem and schedule dict; the
    problem as the stage runs alone (:func:`trainplan.schedule.grad_accumulation.held_alone`). ``solved``: the
    problem the schedule was made for (a pipeline stage's adds its gradients into their sums where made), whose
    replay the schedule's ``peak_bytes`` and ``time`` state; the stage run alone holds its gradients to the end,
    ``held_bytes`` more, and its budget is raised by them."""

    index: int
    nodes: list[str]
    raw: dict[str, Any]
    problem: Problem
    schedule: dict[str, Any]
    solved: Problem

    @property
    def held_bytes(self) -> int:
        """Bytes the stage run alone holds beyond the problem its schedule was made for (0: the same problem)."""
        return self.problem.budget_bytes - self.solved.budget_bytes

    @property
    def budget_bytes(self) -> int:
        """The budget the stage run alone is held to: the schedule's, raised by ``held_bytes``."""
        return int(self.schedule["budget_bytes"]) + self.held_bytes

    @cached_property
    def alone_peak_bytes(self) -> int:
        """The schedule's peak as the stage runs alone: its stated peak plus what holding the gradients adds."""
        stated = int(self.schedule["peak_bytes"])
        if self.solved is self.problem:
            return stated
        return stated + replay(self.problem, self.events).peak_bytes - replay(self.solved, self.events).peak_bytes

    @property
    def requested_budget_bytes(self) -> int:
        """The requested budget of the stage run alone (its problem's: raised by ``held_bytes`` likewise)."""
        return self.problem.budget_bytes

    @property
    def events(self) -> list[tuple[str, str]]:
        return [(str(k), str(o)) for k, o in self.schedule.get("events") or []]

    @property
    def executable(self) -> bool:
        """A schedule with events (an infeasible stage has none)."""
        return bool(self.schedule.get("events"))


def _stage(pos: int, raw: Any, where: str) -> StagePlan:
    if not isinstance(raw, dict):
        raise PlanError(f"{where}: stages[{pos}] must be an object")
    for key in ("nodes", "problem", "schedule"):
        if key not in raw:
            raise PlanError(f"{where}: stages[{pos}] lacks key '{key}'")
    if raw.get("index", pos) != pos:
        raise PlanError(f"{where}: stages[{pos}] has index {raw['index']!r}; stages must be listed in order 0..k-1")
    try:
        solved = problem = problem_from_dict(raw["problem"])
        alone = held_alone(raw["problem"])  # a pipeline's gradients, added into sums where made, held to the end
        if alone is not raw["problem"]:
            problem = problem_from_dict(alone)
    except ProblemError as exc:
        raise PlanError(f"{where}: stages[{pos}].problem: {exc}") from exc
    for op in alone["ops"]:
        if not isinstance(op.get("nodes"), list) or not isinstance(op.get("storages"), list):
            raise PlanError(f"{where}: stages[{pos}] op '{op['id']}' lacks 'nodes'/'storages' (not a stage_problem plan)")
    # the fx nodes its ops run
    nodes = list(dict.fromkeys(n for op in raw["problem"]["ops"] for n in op["nodes"]))
    stage = StagePlan(pos, nodes, alone, problem, raw["schedule"], solved)
    if stage.executable:
        for key in ("time", "peak_bytes", "budget_bytes"):
            if not isinstance(stage.schedule.get(key), (int, float)) or isinstance(stage.schedule.get(key), bool):
                raise PlanError(f"{where}: stage {pos} schedule lacks a numeric '{key}'")
        try:
            replay(solved, stage.events)
            replay(problem, stage.events)
        except ScheduleError as exc:
            raise PlanError(f"{where}: stage {stage.index} schedule: {exc}") from exc
    return stage


def parse_plan(data: Any, where: str = "plan") -> list[StagePlan]:
    """Validate a plan dict; every problem and every event list must be valid (PlanError otherwise)."""
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list) or not data["stages"]:
        raise PlanError(f"{where}: expected an object with a non-empty 'stages' list")
    stages = [_stage(pos, raw, where) for pos, raw in enumerate(data["stages"])]
    seen: set[str] = set()
    for st in stages:
        dup = seen.intersection(st.nodes)
        if dup:
            raise PlanError(f"{where}: node(s) {sorted(dup)[:3]} appear in more than one stage")
        seen.update(st.nodes)
    return stages


def load_plan(path: str | Path) -> tuple[dict[str, Any], list[StagePlan]]:
    """Read and validate ``plan.json``; a missing or corrupt file raises PlanError naming it."""
    try:
        data = read_json(path, schema="plan")
    except ArtifactError as exc:
        raise PlanError(str(exc)) from exc
    return data, parse_plan(data, str(path))


def sums_in_place(stages: list[StagePlan]) -> bool:
    """Whether the plan's problems were made on the traced step with its tied gradient sums in place: every plan's
    but a pipeline's, whose stage problems see them functional (``trainplan.export.functional_sums``); trace the
    step to run it with ``trace_training_step(..., sums_in_place=sums_in_place(stages))``."""
    return not any(int((st.raw.get("pipeline") or {}).get("k", 1)) >= 2 for st in stages)


def split_nodes(names: list[str], k: int) -> list[list[str]]:
    """The node list cut into ``k`` contiguous, nearly equal parts (fallback partition)."""
    size = -(-len(names) // k)
    return [names[i : i + size] for i in range(0, len(names), size)]


def plan_stage(nodes: pd.DataFrame, tensors: pd.DataFrame, stage_nodes: list[str], *, index: int,
               budget: Budget | str | int | float, bandwidth: float, swap: bool = True, time_limit_s: float = 10.0,
               workers: int = 1, seed: int = 0, optimizer_state_bytes: int = 0,
               allocation: str | None = None) -> dict[str, Any]:
    """One stage of a plan: its problem (``stage_problem``; ``swap=False``: no swaps; ``allocation``: storages
    weighed at that device type's allocation sizes) at ``budget`` (bytes, or a fraction of its no-recompute peak:
    :mod:`trainplan.budget`) and our solver's schedule of it, raised to the least budget found where the requested
    one is not met (the schedule says so). ``optimizer_state_bytes``: the state of an optimizer whose updates run
    in the step, resident throughout (fixed bytes)."""
    raw = stage_problem(nodes, tensors, stage_nodes, bandwidth=bandwidth, swap=swap, allocation=allocation)
    if optimizer_state_bytes:
        raw["fixed_bytes"] += int(optimizer_state_bytes)
        raw["optimizer_state_bytes"] = int(optimizer_state_bytes)
    raw["budget_bytes"] = budget_for(raw, budget)
    schedule = solve(problem_from_dict(raw), time_limit_s, workers, seed)
    return {"index": index, "nodes": list(stage_nodes), "problem": raw, "schedule": schedule.to_dict()}


def build_plan(
    nodes: pd.DataFrame,
    tensors: pd.DataFrame,
    stages: list[list[str]],
    *,
    model: str,
    device: str,
    fraction: float,
    bandwidth: float,
    time_limit_s: float = 10.0,
    workers: int = 1,
    seed: int = 0,
) -> dict[str, Any]:
    """A plan in the balance rule's format: each stage scheduled at ``fraction`` of its no-recompute peak.

    ``nodes`` must carry the profile's ``time_s``.
    """
    out = [plan_stage(nodes, tensors, stage_nodes, index=index, budget=float(fraction), bandwidth=bandwidth,
                      time_limit_s=time_limit_s, workers=workers, seed=seed)
           for index, stage_nodes in enumerate(stages)]
    return {"model": model, "device": device, "k": len(stages), "budget_fraction": fraction, "stages": out}
