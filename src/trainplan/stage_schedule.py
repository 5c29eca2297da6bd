"""Schedule pipeline stages at a budget fraction: one stage problem builder and solver shared by the
``schedule`` rule (our solver and every baseline) and the ``balance`` loop (our solver, cached)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
from tqdm import tqdm

from trainplan.schedule.problem import problem_from_dict
from trainplan.schedule.schedule_io import Schedule
from trainplan.schedule.solve import METHODS, solve
from trainplan.stage_problem import budget_for, no_recompute_peak, stage_problem


@dataclass(frozen=True)
class SolverSettings:
    """CP-SAT time limit (s, per stage schedule, bisection included), workers and seed, from config."""

    time_limit_s: float
    workers: int
    seed: int


def budgeted_stage_problem(nodes: pd.DataFrame, tensors: pd.DataFrame, stage_nodes: list[str], *,
                           fraction: float, bandwidth: float) -> dict[str, Any]:
    """The stage's problem dict with ``budget_bytes`` at ``fraction`` of its no-recompute activation peak."""
    raw = stage_problem(nodes, tensors, stage_nodes, bandwidth=bandwidth)
    raw["budget_bytes"] = budget_for(raw, fraction)
    raw["budget_fraction"] = fraction
    raw["no_recompute_peak_bytes"] = no_recompute_peak(raw)
    return raw


def solve_stage(raw: dict[str, Any], solver: SolverSettings, method: str = "ours") -> Schedule:
    """Solve a budgeted stage problem with one method (ours bisects to the smallest feasible budget)."""
    return solve(problem_from_dict(raw), solver.time_limit_s, solver.workers, solver.seed, method=method)


@dataclass
class StageSchedules:
    """One stage's problem (dict, budget set), our schedule and every method's schedule at the same budget."""

    index: int
    nodes: list[str]
    problem: dict[str, Any]
    ours: Schedule
    methods: dict[str, dict[str, Any]]


def schedule_stages(nodes: pd.DataFrame, tensors: pd.DataFrame, stages: list[list[str]], *, fraction: float,
                    bandwidth: float, solver: SolverSettings, progress: bool = True) -> list[StageSchedules]:
    """Build each stage's problem at ``fraction`` of its no-recompute peak and solve it with every method.

    Our method bisects to the smallest feasible budget when the requested one is infeasible; the
    baselines are run at the requested budget and report ``infeasible`` where they cannot meet it.
    """
    out: list[StageSchedules] = []
    for index, stage_nodes in enumerate(tqdm(stages, desc="schedule stages", disable=not progress)):
        raw = budgeted_stage_problem(nodes, tensors, stage_nodes, fraction=fraction, bandwidth=bandwidth)
        ours = solve_stage(raw, solver)
        methods = {m: solve_stage(raw, solver, m).to_dict() for m in METHODS if m != "ours"}
        methods["ours"] = ours.to_dict()
        out.append(StageSchedules(index, list(stage_nodes), raw, ours, methods))
    return out


def comparison_table(model: str, k: int, fraction: float, results: list[StageSchedules]) -> pd.DataFrame:
    """One row per stage and method: status, time, overhead over no-recompute, peak, budget, gap, solve time.
    A schedule over the budget keeps its time and peak (``over_budget``); ``memory_fraction`` is its peak
    above the fixed bytes as a fraction of the no-recompute activation peak."""
    rows = []
    for res in results:
        base = res.methods["no_recompute"]["time"]
        fixed, nr_peak = res.problem.get("fixed_bytes", 0), res.problem["no_recompute_peak_bytes"]
        for method, sched in res.methods.items():
            time = sched.get("time")
            peak = sched.get("peak_bytes")
            rows.append(
                {
                    "model": model,
                    "k": k,
                    "budget_fraction": fraction,
                    "stage": res.index,
                    "method": method,
                    "status": sched["status"],
                    "time_s": time,
                    "overhead": (time / base - 1.0) if time is not None and base else None,
                    "peak_bytes": peak,
                    "over_budget": peak is not None and peak > res.problem["budget_bytes"],
                    "memory_fraction": (peak - fixed) / (nr_peak - fixed) if peak is not None and nr_peak > fixed else None,
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
