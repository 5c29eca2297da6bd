"""Baselines in the schedule format: no recompute, sqrt(n) checkpointing, swap-only greedy.

The recompute-only MILP baseline (Checkmate) lives in ``checkmate.py``.
"""

from __future__ import annotations

import math
import time

from trainplan.schedule.heuristic import POLICIES, Limits, Simulator, greedy
from trainplan.schedule.problem import Problem
from trainplan.schedule.replay import replay
from trainplan.schedule.schedule_io import Schedule, from_events, no_schedule


def no_recompute_events(problem: Problem) -> list[tuple[str, str]]:
    """Program order, each tensor freed right after its last use (defines the no-recompute peak)."""
    events = Simulator(problem, None).run()
    assert events is not None  # no cap: cannot fail
    return events


def no_recompute(problem: Problem) -> Schedule:
    """Baseline 1: no recompute, no swap. Infeasible when its peak exceeds the budget."""
    start = time.perf_counter()
    events = no_recompute_events(problem)
    return from_events(problem, events, method="no_recompute", solve_seconds=time.perf_counter() - start)


def sqrt_checkpoint_events(problem: Problem, stop_at: float | None = None) -> list[tuple[str, str]] | None:
    """Chen et al. 2016 on a general DAG: segments of ceil(sqrt(n)) ops in program order.

    Segment boundaries (the last op of each segment), keep ops and recompute=false ops are
    checkpoints. After each step a non-checkpoint tensor whose next reader lies in a later segment
    is dropped, if it can be rebuilt there: every checkpoint its recomputation reads is still live
    at that reader (a checkpoint is freed after its own last reader, as in the no-recompute order).
    A reader that finds an input missing recomputes it (and its missing inputs) from the
    checkpoints, as the backward pass re-runs a segment's interior. No memory cap is applied.
    """
    n = problem.n
    seg = max(1, math.ceil(math.sqrt(n)))
    checkpoint = {i for i in range(n) if i % seg == seg - 1 or i == n - 1}
    checkpoint |= problem.keep_idx | {i for i, op in enumerate(problem.ops) if not op.recompute}

    def rebuildable(u: int, at: int) -> bool:
        """u's recomputation at step ``at`` reads only checkpoints live then (through dropped inputs)."""
        stack, seen = list(problem.inputs[u]), set()
        while stack:
            w = stack.pop()
            if w in seen:
                continue
            seen.add(w)
            if w in checkpoint:
                if problem.next_use(w, at) is None:
                    return False
            else:
                stack.extend(problem.inputs[w])
        return True

    def drop_interior(sim: Simulator, i: int) -> None:
        for u in sorted(sim.resident):
            nu = problem.next_use(u, i + 1)
            if u not in checkpoint and nu is not None and nu // seg > i // seg and rebuildable(u, nu):
                sim.free(u)

    return Simulator(problem, None, allow_swap=False, limits=Limits(stop_at)).run(after_step=drop_interior)


def sqrt_checkpoint(problem: Problem, time_limit_s: float = 10.0) -> Schedule:
    """Baseline 2: sqrt(n) checkpointing. Budget-agnostic: over the budget its schedule is still given,
    with status ``over_budget``."""
    start = time.perf_counter()
    events = sqrt_checkpoint_events(problem, stop_at=start + time_limit_s)
    if events is None:
        return no_schedule(problem.budget_bytes, "sqrt_checkpoint", time.perf_counter() - start,
                           "time limit passed before the schedule was complete", status="unknown")
    return from_events(problem, events, method="sqrt_checkpoint", solve_seconds=time.perf_counter() - start)


def swap_only(problem: Problem, time_limit_s: float = 10.0) -> Schedule:
    """Baseline 4: greedy eviction that only swaps (best of the eviction policies). If no policy meets the
    budget, the least budget the greedy meets (bisection to 0.5%, between the budget and the no-recompute
    peak, within the time limit) and its schedule there, with status ``over_budget``."""
    start = time.perf_counter()
    deadline = start + time_limit_s
    budget = problem.budget_bytes
    best, best_time = None, math.inf
    for policy in POLICIES:
        events = greedy(problem, budget, allow_recompute=False, policy=policy, limits=Limits(deadline))
        if events is not None and (t := replay(problem, events).time) < best_time:
            best, best_time = events, t
    extra = {}
    if best is None:
        lo, hi, best = budget, None, no_recompute_events(problem)
        hi = replay(problem, best).peak_bytes
        while hi - lo > max(1, int(0.005 * hi)) and time.perf_counter() < deadline:
            mid = (lo + hi) // 2
            events = greedy(problem, mid, allow_recompute=False, limits=Limits(deadline))
            if events is None:
                lo = mid
            else:
                best, hi = events, replay(problem, events).peak_bytes
        extra["note"] = f"greedy swap-only eviction cannot meet the budget; the least budget it met: {hi} B"
    return from_events(problem, best, method="swap_only", solve_seconds=time.perf_counter() - start, extra=extra)
