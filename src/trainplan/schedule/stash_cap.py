"""A pipeline stage's schedule that keeps less at its split, so that its rank holds the other in-flight
micro-batches' stashes within the rank's budget.

A stage problem solved for a pipeline (``budgeted_stage_problem``) keeps from the rank's budget the other in-flight
micro-batches' stashes as the plan without recompute holds them. Where the rank's peak with the schedule found is
over the rank's budget, a schedule that recomputes forward values instead of holding them at its split may meet
it: its own micro-batch gets more of the budget when each stash is smaller. The solver's model has no stash term,
so :func:`smaller_stash` solves the problem again with the stash held to a cap ``s``: the running micro-batch's
budget is the rank's less the sums, carriers and the others held with stash ``s`` (``pipeline_hold.others_held``:
``(in_flight - 1) * s`` without pending sends), and the op at the split (the first of
the backward phase) gets a stand-in workspace so that what is resident when it runs is at most ``s``
(:func:`capped`). Caps are tried at fractions of the most the rank leaves beside the stage's memory floor; the
fastest schedule whose rank peak meets the rank's budget is kept, else the one with the least rank peak. The
kept problem is stored without the stand-in workspace and its schedule's peak replayed on it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from trainplan.schedule.pipeline_hold import hold_beside, largest_stash, stash_bytes
from trainplan.schedule.problem import problem_from_dict
from trainplan.schedule.replay import replay
from trainplan.schedule.schedule_io import Schedule

#: caps tried, as fractions of the largest stash the rank leaves beside the stage's floor: a cap near 1 leaves the
#: running micro-batch at its floor (few schedules), near 0 it forces recomputing most of the forward (slow)
CAP_FRACTIONS = (0.75, 0.5, 0.25)


def split_op(problem: dict[str, Any]) -> dict[str, Any] | None:
    """The first op of the backward phase: its first compute is the schedule's split (``split_position``)."""
    return next((op for op in problem["ops"] if op.get("phase", "forward") == "backward"), None)


def rank_peak(problem: dict[str, Any], schedule: Schedule) -> int | None:
    """The rank's peak (its hold's in-flight micro-batches) with ``schedule`` (``PipelineMetrics.rank_peak_bytes``);
    None without events."""
    hold = problem["pipeline"]
    if not schedule.ok or schedule.peak_bytes is None:
        return None
    return int(schedule.peak_bytes) + hold_beside(hold, stash_bytes(problem, schedule.events))


def capped(problem: dict[str, Any], cap: int) -> dict[str, Any]:
    """``problem`` with the other in-flight stashes held to ``cap`` bytes each: its budget the rank's less the sums,
    carriers and those stashes, and the split op's workspace raised (``stash_cap_workspace``) so that at most
    ``cap`` bytes are resident when it runs."""
    out = copy.deepcopy(problem)
    hold = out["pipeline"]
    reserve = hold_beside(hold, cap)
    budget = max(0, hold["rank_budget_bytes"] - reserve)
    op = split_op(out)
    assert op is not None, "a pipeline stage problem has a backward phase"
    stand_in = max(0, budget - out["fixed_bytes"] - int(op["bytes"]) - int(op.get("workspace", 0)) - cap)
    op["workspace"] = int(op.get("workspace", 0)) + stand_in
    op["stash_cap_workspace"] = stand_in
    hold.update(stash_cap_bytes=cap, reserve_bytes=reserve)
    out["budget_bytes"] = budget
    return out


def uncapped(problem: dict[str, Any]) -> dict[str, Any]:
    """A :func:`capped` problem without its stand-in workspace (its budget and recorded cap kept)."""
    out = copy.deepcopy(problem)
    for op in out["ops"]:
        if "stash_cap_workspace" in op:
            op["workspace"] = int(op["workspace"]) - int(op.pop("stash_cap_workspace"))
    return out


def smaller_stash(problem: dict[str, Any], schedule: Schedule, solve: Callable[[dict[str, Any], float], Schedule],
                  seconds: float) -> tuple[dict[str, Any], Schedule]:
    """The problem and schedule to keep for a pipeline stage (see the module): ``schedule`` where its rank peak
    meets the rank's budget, else the best of it and the capped solves (``solve(problem, time_limit_s)``), which
    share ``seconds`` (the caller's time limit left)."""
    hold = problem.get("pipeline") or {}
    n, rank_budget = hold.get("in_flight", 1), hold.get("rank_budget_bytes")
    peak = rank_peak(problem, schedule) if hold else None
    if n < 2 or peak is None or peak <= rank_budget:
        return problem, schedule
    floor = problem_from_dict(problem).floor_bytes
    largest = largest_stash(rank_budget - hold["gradient_sum_bytes"] - hold["carrier_bytes"] - floor, n,
                            hold.get("pending_gradient_sends", 0), hold.get("carrier_in_bytes", 0))
    if largest <= 0 or seconds <= 0:
        return problem, schedule
    best = (problem, schedule, peak)
    for f in CAP_FRACTIONS:
        cap = min(hold["no_recompute_stash_bytes"], int(f * largest))
        held_to_cap = capped(problem, cap)
        found = solve(held_to_cap, seconds / len(CAP_FRACTIONS))
        plain = uncapped(held_to_cap)
        if not found.ok:
            continue
        found.peak_bytes = replay(problem_from_dict(plain), found.events).peak_bytes
        found.extra["stash_cap_bytes"] = cap
        best = min(best, (plain, found, rank_peak(plain, found)), key=lambda c: _rank(c, rank_budget))
    return best[0], best[1]


def _rank(candidate: tuple[dict[str, Any], Schedule, int | None], rank_budget: int) -> tuple[int, float]:
    """Order of preference: meeting the rank's budget, then the fastest; else the least rank peak."""
    _, schedule, peak = candidate
    if peak is None:
        return (2, 0.0)
    return (0, float(schedule.time)) if peak <= rank_budget else (1, float(peak))
