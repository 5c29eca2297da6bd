"""Baselines in the schedule format: no recompute, sqrt(n) checkpointing, swap-only greedy.

The recompute-only MILP baseline (Checkmate) lives in ``checkmate.py``.
"""

from __future__ import annotations

import math
import time

from trainplan.schedule.heuristic import POLICIES, Simulator, greedy
from trainplan.schedule.problem import Problem
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
    return from_events(problem, events, budget_bytes=problem.budget_bytes, method="no_recompute",
                       solve_seconds=time.perf_counter() - start)


def sqrt_checkpoint_events(problem: Problem) -> list[tuple[str, str]] | None:
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

    return Simulator(problem, None, allow_swap=False).run(after_step=drop_interior)


def sqrt_checkpoint(problem: Problem) -> Schedule:
    """Baseline 2: sqrt(n) checkpointing (budget-agnostic; infeasible when its peak is over)."""
    start = time.perf_counter()
    events = sqrt_checkpoint_events(problem)
    if events is None:
        return no_schedule(problem.budget_bytes, "sqrt_checkpoint", time.perf_counter() - start,
                           "a dropped tensor cannot be recomputed (recompute=false upstream)")
    return from_events(problem, events, budget_bytes=problem.budget_bytes, method="sqrt_checkpoint",
                       solve_seconds=time.perf_counter() - start)


def swap_only(problem: Problem) -> Schedule:
    """Baseline 4: greedy eviction that only swaps (best of the eviction policies)."""
    start = time.perf_counter()
    best = None
    for policy in POLICIES:
        events = greedy(problem, problem.budget_bytes, allow_recompute=False, policy=policy)
        if events is not None:
            sched = from_events(problem, events, budget_bytes=problem.budget_bytes, method="swap_only",
                                solve_seconds=0.0)
            if best is None or sched.time < best.time:
                best = sched
    elapsed = time.perf_counter() - start
    if best is None:
        return no_schedule(problem.budget_bytes, "swap_only", elapsed,
                           "greedy swap-only eviction cannot meet the budget")
    best.solve_seconds = elapsed
    return best
