"""Schedule every stage of a partition with our solver and every baseline, at one budget fraction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
from tqdm import tqdm

from trainplan.schedule.problem import problem_from_dict
from trainplan.schedule.solve import METHODS, solve
from trainplan.stage_problem import budget_for, no_recompute_peak, stage_problem


@dataclass
class StageSchedules:
    """One stage's problem (dict, budget set), our schedule and every method's schedule at the same budget."""

    index: int
    problem: dict[str, Any]
    ours: dict[str, Any]
    methods: dict[str, dict[str, Any]]


def schedule_stages(
    nodes: pd.DataFrame,
    tensors: pd.DataFrame,
    stages: list[list[str]],
    *,
    fraction: float,
    bandwidth: float,
    time_limit_s: float,
    workers: int,
    seed: int,
    progress: bool = True,
) -> list[StageSchedules]:
    """Build each stage's problem at ``fraction`` of its no-recompute peak and solve it with every method.

    Our method bisects to the smallest feasible budget when the requested one is infeasible; the
    baselines are run at the requested budget and report ``infeasible`` where they cannot meet it.
    """
    out: list[StageSchedules] = []
    for index, stage_nodes in enumerate(tqdm(stages, desc="schedule stages", disable=not progress)):
        raw = stage_problem(nodes, tensors, stage_nodes, bandwidth=bandwidth)
        raw["budget_bytes"] = budget_for(raw, fraction)
        raw["budget_fraction"] = fraction
        raw["no_recompute_peak_bytes"] = no_recompute_peak(raw)
        problem = problem_from_dict(raw)
        ours = solve(problem, time_limit_s, workers, seed)
        methods = {m: solve(problem, time_limit_s, workers, seed, method=m).to_dict() for m in METHODS if m != "ours"}
        methods["ours"] = ours.to_dict()
        out.append(StageSchedules(index, raw, ours.to_dict(), methods))
    return out


def comparison_table(model: str, k: int, fraction: float, results: list[StageSchedules]) -> pd.DataFrame:
    """One row per stage and method: status, time, overhead over no-recompute, peak, budget, gap, solve time."""
    rows = []
    for res in results:
        base = res.methods["no_recompute"]["time"]
        for method, sched in res.methods.items():
            time = sched.get("time")
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
                    "peak_bytes": sched.get("peak_bytes"),
                    "budget_bytes": sched["budget_bytes"],
                    "requested_budget_bytes": res.problem["budget_bytes"],
                    "gap": sched.get("gap"),
                    "solve_seconds": sched.get("solve_seconds"),
                    "recomputes": sched.get("recomputes"),
                    "swap_ins": sched.get("swap_ins"),
                }
            )
    return pd.DataFrame(rows)
