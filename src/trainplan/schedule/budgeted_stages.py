"""Schedule pipeline stages at a budget (bytes or a fraction, :mod:`trainplan.budget`): one stage problem builder and solver (``schedule_stage``)
shared by the ``schedule`` rule (our solver and every baseline) and the ``balance`` loop (our solver, cached;
iteration 0 reads the ``schedule`` rule's ``schedules.json``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from trainplan.budget import Budget
from trainplan.errors import ArtifactError
from trainplan.export.functional_sums import functional_sum_tables
from trainplan.io import read_json
from trainplan.schedule.baselines import no_recompute
from trainplan.schedule.grad_accumulation import accumulate_where_made, tied_partials_as_zeros
from trainplan.schedule.pipeline_hold import PipelineHold, stage_hold
from trainplan.schedule.problem import problem_from_dict
from trainplan.schedule.schedule_io import Schedule, schedule_from_dict
from trainplan.schedule.solve import METHODS, solve
from trainplan.schedule.stage_problem import budget_for, stage_problem
from trainplan.schedule.stash_cap import smaller_stash


@dataclass(frozen=True)
class SolverSettings:
    """CP-SAT time limit (s, per stage schedule, bisection included), workers and seed, from config."""

    time_limit_s: float
    workers: int
    seed: int


@dataclass(frozen=True)
class StageBudget:
    """How a stage's problem is made: its ``requested`` budget (bytes, or a fraction of its no-recompute activation
    peak: ``stage_problem.budget_for``), the host link's ``bandwidth`` (bytes per second), whether ops may be
    swapped (``swap=False``: a device whose host memory is shared, ``memory_model.memory_model``), the device type
    whose allocation sizes weigh each storage (``allocation``: what the budget's meter counts, a CPU tensor's pages
    and objects, a CUDA block's rounding, ``memory_model.allocation_bytes``; None: data bytes), and the
    ``pipeline`` the stage runs in (None: the stage alone; else the requested budget is the rank's, its 1F1B
    in-flight stashes and gradient sums held: :mod:`trainplan.schedule.pipeline_hold`)."""

    requested: Budget
    bandwidth: float
    swap: bool = True
    pipeline: PipelineHold | None = None
    allocation: str | None = None


def budgeted_stage_problem(nodes: pd.DataFrame, tensors: pd.DataFrame, stage_nodes: list[str],
                           budget: StageBudget, index: int = 0) -> dict[str, Any]:
    """Stage ``index``'s problem dict with ``budget_bytes`` at the requested budget (its ``budget_fraction`` too,
    None for bytes). In a pipeline (``budget.pipeline``), the requested budget is the rank's (a fraction: the fixed
    bytes, gradient sums and carriers + that fraction of the rest of the rank's peak without recompute), recorded
    with the stage's hold under ``pipeline``, and ``budget_bytes``, what the running micro-batch's schedule may use,
    is that less the hold's reserve; its embedding gradient sums are functional (``export.functional_sums``), a
    tied partial it receives is zeros, and with m > 1 its gradients are added into their sums where made
    (:mod:`trainplan.schedule.grad_accumulation`)."""
    pipelined = budget.pipeline is not None and budget.pipeline.k >= 2
    if pipelined:
        nodes, tensors = functional_sum_tables(nodes, tensors)
    raw = stage_problem(nodes, tensors, stage_nodes, bandwidth=budget.bandwidth, swap=budget.swap,
                        allocation=budget.allocation)
    if pipelined:
        raw = tied_partials_as_zeros(raw)
        if budget.pipeline.accumulates:
            raw = accumulate_where_made(raw)
    raw["budget_fraction"] = budget.requested.fraction
    plain = no_recompute(problem_from_dict({**raw, "budget_bytes": 2**62}))
    raw["no_recompute_peak_bytes"] = int(plain.peak_bytes)
    if budget.pipeline is None or budget.pipeline.k < 2:
        raw["budget_bytes"] = budget_for(raw, budget.requested, peak=raw["no_recompute_peak_bytes"])
        return raw
    hold = stage_hold(raw, budget.pipeline, index, plain.events)
    stashes = (hold.in_flight - 1) * hold.no_recompute_stash
    # a fraction counts the gradient sums and carriers as held bytes, like the fixed ones: no schedule shrinks them
    rank_budget = budget_for(raw, budget.requested, peak=raw["no_recompute_peak_bytes"] + stashes) + (
        hold.sums + hold.carriers if budget.requested.fraction is not None else 0)
    raw["budget_bytes"] = max(0, rank_budget - hold.reserve)  # below the reserve: infeasible, raised by our solver
    raw["pipeline"] = {"k": budget.pipeline.k, "micro_batches": budget.pipeline.micro_batches,
                       "schedule": budget.pipeline.schedule, "stages_per_rank": budget.pipeline.stages_per_rank,
                       **hold.to_dict(), "rank_budget_bytes": rank_budget}
    return raw


def solve_stage(raw: dict[str, Any], solver: SolverSettings, method: str = "ours") -> Schedule:
    """Solve a budgeted stage problem with one method (ours bisects to the smallest feasible budget)."""
    return solve(problem_from_dict(raw), solver.time_limit_s, solver.workers, solver.seed, method=method)


def schedule_stage(nodes: pd.DataFrame, tensors: pd.DataFrame, stage_nodes: list[str], *, budget: StageBudget,
                   solver: SolverSettings, index: int = 0) -> tuple[dict[str, Any], Schedule]:
    """The one place a stage is scheduled with our method, for the ``schedule`` rule and the balance loop:
    its budgeted problem and our schedule. A pipeline stage whose rank peak is over the rank's budget is solved
    again with its stash held smaller, in the time its first solve left (:mod:`trainplan.schedule.stash_cap`)."""
    raw = budgeted_stage_problem(nodes, tensors, stage_nodes, budget, index)
    t0 = time.perf_counter()
    first = solve_stage(raw, solver)
    left = solver.time_limit_s - (time.perf_counter() - t0)
    return smaller_stash(raw, first, lambda problem, seconds: solve(problem_from_dict(problem), seconds,
                                                                     solver.workers, solver.seed), left)


@dataclass
class StageSchedules:
    """One stage's problem (dict, budget set), our schedule and every method's schedule at the same budget."""

    index: int
    nodes: list[str]
    problem: dict[str, Any]
    ours: Schedule
    methods: dict[str, dict[str, Any]]


def schedule_stages(nodes: pd.DataFrame, tensors: pd.DataFrame, stages: list[list[str]], *, budget: StageBudget,
                    solver: SolverSettings, progress: bool = True) -> list[StageSchedules]:
    """Build each stage's problem at the requested budget and solve it with every method.

    Our method bisects to the smallest feasible budget when the requested one is infeasible; the
    baselines are run at the requested budget and report ``infeasible`` where they cannot meet it.
    """
    out: list[StageSchedules] = []
    for index, stage_nodes in enumerate(tqdm(stages, desc="schedule stages", disable=not progress)):
        raw, ours = schedule_stage(nodes, tensors, stage_nodes, budget=budget, solver=solver, index=index)
        methods = {m: solve_stage(raw, solver, m).to_dict() for m in METHODS if m != "ours"}
        methods["ours"] = ours.to_dict()
        out.append(StageSchedules(index, list(stage_nodes), raw, ours, methods))
    return out


def stage_schedules_dict(head: dict[str, Any], results: list[StageSchedules]) -> dict[str, Any]:
    """The ``schedules.json`` of one budget: ``head`` (model, device, k, ``Budget.fields``) and per stage its
    index, fx nodes, problem, our schedule and every method's schedule at the requested budget."""
    return {**head, "stages": [{"index": r.index, "nodes": r.nodes, "problem": r.problem, "schedule": r.ours.to_dict(),
                                "methods": {m: d for m, d in r.methods.items() if m != "ours"}} for r in results]}


def read_stage_schedules(path: str | Path, stages: list[list[str]] | None = None) -> list[StageSchedules]:
    """Read and check a ``schedules.json``: every stage's problem is valid, every schedule replays on it to
    the time and peak it states, and (given ``stages``, the partition's node lists) the stages are the
    partition's. Raises ArtifactError naming the file and the stage."""
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list):
        raise ArtifactError(f"{path}: not a schedules file (no 'stages' list)")
    if stages is not None and len(data["stages"]) != len(stages):
        raise ArtifactError(f"{path}: {len(data['stages'])} stage(s), but the partition has {len(stages)}")
    out = []
    for pos, raw in enumerate(data["stages"]):
        where = f"{path}: stage {pos}"
        try:
            if raw["index"] != pos:
                raise ValueError(f"index {raw['index']} at position {pos}")
            if stages is not None and raw["nodes"] != stages[pos]:
                raise ValueError("its nodes are not the partition's stage (a stale or foreign file)")
            problem = problem_from_dict(raw["problem"])
            ours = schedule_from_dict(problem, raw["schedule"])
            methods = {m: schedule_from_dict(problem, d).to_dict() for m, d in raw["methods"].items()}
        except (KeyError, TypeError, ValueError) as exc:  # ProblemError and ScheduleError are ValueErrors
            what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ArtifactError(f"{where}: {what}") from exc
        out.append(StageSchedules(pos, list(raw["nodes"]), raw["problem"], ours, {**methods, "ours": ours.to_dict()}))
    return out


def comparison_table(model: str, k: int, budget: Budget, results: list[StageSchedules]) -> pd.DataFrame:
    """One row per stage and method at the requested ``budget`` (``budget``: its label, ``budget_fraction``: None for
    bytes): status, time, overhead over no-recompute, peak, budget, gap, solve time.
    A schedule over the budget keeps its time and peak (``over_budget``); ``memory_fraction`` is its peak
    above the fixed bytes as a fraction of the no-recompute activation peak, ``requested_memory_fraction`` the
    requested budget's on the same scale."""
    rows = []
    for res in results:
        base = res.methods["no_recompute"]["time"]
        fixed, nr_peak = res.problem.get("fixed_bytes", 0), res.problem["no_recompute_peak_bytes"]
        scale = (lambda b: (b - fixed) / (nr_peak - fixed)) if nr_peak > fixed else (lambda b: None)
        for method, sched in res.methods.items():
            time = sched.get("time")
            peak = sched.get("peak_bytes")
            rows.append(
                {
                    "model": model,
                    "k": k,
                    "budget": budget.label,
                    "budget_fraction": budget.fraction,
                    "stage": res.index,
                    "method": method,
                    "status": sched["status"],
                    "time_s": time,
                    "overhead": (time / base - 1.0) if time is not None and base else None,
                    "peak_bytes": peak,
                    "over_budget": peak is not None and peak > res.problem["budget_bytes"],
                    "memory_fraction": None if peak is None else scale(peak),
                    "requested_memory_fraction": scale(res.problem["budget_bytes"]),
                    "budget_bytes": sched["budget_bytes"],
                    "requested_budget_bytes": res.problem["budget_bytes"],
                    "fixed_bytes": fixed,
                    "no_recompute_peak_bytes": nr_peak,
                    "gap": sched.get("gap"),
                    "solve_seconds": sched.get("solve_seconds"),
                    "recomputes": sched.get("recomputes"),
                    "swap_ins": sched.get("swap_ins"),
                    "note": sched.get("note"),
                }
            )
    return pd.DataFrame(rows)
