"""The bounds and improvement strategies of the portfolio (relaxation, guided greedy, restricted CP-SAT, staged
bound, CP-SAT with window LNS and grid growth), and the answer of one attempt: each step's run on a
:class:`~trainplan.schedule.context.Context`. Which of them run, in which order and when, is said in
``schedule/portfolio.py``.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from trainplan.schedule.bounds import RELAXATION_PROOF, Bound, floor_proof, relaxation_bound, trivial_bound
from trainplan.schedule.context import Context, Polished
from trainplan.schedule.fast import cp_hint
from trainplan.schedule.heuristic import Events, guided
from trainplan.schedule.mip import CpSatRun, MipResult, ModelSpec, SearchStop, objective_ticks, solve_mip
from trainplan.schedule.replay import ScheduleError, replay
from trainplan.schedule.schedule_io import Optimality, Schedule, from_events, no_schedule, set_budget_status
from trainplan.schedule.staged_bound import solve_staged, staged_variables
from trainplan.schedule.staged_events import staged_events


@dataclass(frozen=True)
class CpSatStep:
    """The terms of one full-model CP-SAT run: its limit (seconds of the time budget) and wall-clock cap, the lower
    bound in objective ticks, its hint, its workers (default: the call's), a stop flag another thread may raise,
    and a larger grid (copies per op, remat slots per block) than the default."""

    time_s: float
    wall_s: float
    bound_ticks: int
    hint: Events | None = None
    workers: int | None = None
    stop: SearchStop | None = None
    grid: tuple[int, int] | None = None


def cpsat(ctx: Context, step: CpSatStep) -> MipResult:
    """CP-SAT on the full model (``mip.solve_mip``), window LNS after a hinted search."""
    run = ctx.run
    copies, slots = (run.copies, None) if step.grid is None else step.grid
    cp_run = CpSatRun(step.time_s, run.workers if step.workers is None else step.workers, run.seed, run.deterministic,
                      run.verbose, step.wall_s, ctx.settings.lns_share)
    return solve_mip(ctx.problem, ctx.budget, cp_run, ModelSpec(step.hint, copies, slots, step.bound_ticks), step.stop)


def grow_grid(ctx: Context, res: MipResult, step: CpSatStep) -> MipResult:
    """While CP-SAT proves its schedule optimal only within its grid (C copies per op, K remat slots per block: a
    good hint sizes the grid to itself) above the lower bound ``step.bound_ticks``, and at least ``grow_min_s`` of
    ``step.time_s`` (wall: ``step.wall_s``) is left: once more on a grid one copy and one slot larger, hinted with
    that schedule; until a larger grid gains nothing. The last result that is no worse, its ``work_s`` covering
    every run (``stats["grown"]`` lists the larger grids' runs)."""
    t0, used, runs = time.perf_counter(), res.work_s, []
    ticks = None if res.events is None else objective_ticks(ctx.problem, res.events)
    while (res.status == "OPTIMAL" and ticks is not None and ticks > step.bound_ticks
           and min(step.time_s - used, step.wall_s - (time.perf_counter() - t0)) >= ctx.settings.grow_min_s
           and not (step.stop is not None and step.stop.requested)):
        grid = (res.stats["copies"] + 1, res.stats["slots"] + 1)
        more = cpsat(ctx, replace(step, time_s=step.time_s - used, wall_s=step.wall_s - (time.perf_counter() - t0),
                                  hint=res.events, grid=grid))
        used += more.work_s
        runs.append({"copies": grid[0], "slots": grid[1], "status": more.status, "objective": more.objective_s,
                     "wall_seconds": round(more.wall_s, 3)})
        more_ticks = None if ctx.valid(more.events) is None else objective_ticks(ctx.problem, more.events)
        if more_ticks is None or more_ticks > ticks:
            break
        res, gained, ticks = more, more_ticks < ticks, more_ticks
        if not gained:  # the larger grid holds nothing better: a still larger one rarely does
            break
    if not runs:
        return res
    return replace(res, work_s=used, stats={**res.stats, "grown": runs})


def _cpsat_grown(ctx: Context, step: CpSatStep) -> MipResult:
    """CP-SAT for ``step``, its grid grown while it ends optimal within it (:func:`grow_grid`)."""
    t0 = time.perf_counter()
    res = cpsat(ctx, step)
    return grow_grid(ctx, res, replace(step, wall_s=step.wall_s - (time.perf_counter() - t0)))


def in_first_compute_order(ctx: Context) -> str:
    """The problem with its ops in the order of the incumbent's first computes (the last-compute search's come in any
    order; every later step follows the program order): the bounds below hold over schedules in that order."""
    order = list(dict.fromkeys(oid for kind, oid in ctx.incumbent.events or [] if kind == "compute"))
    ctx.problem = ctx.problem.in_order(order)
    ctx.extra["program_order"] = f"the first computes of the {ctx.incumbent.name} schedule"
    return ctx.extra["program_order"]


def reordered(ctx: Context) -> bool:
    """The incumbent's first computes are not in program order."""
    events = ctx.incumbent.events
    if events is None:
        return False
    return list(dict.fromkeys(oid for kind, oid in events if kind == "compute")) != [op.id for op in ctx.problem.ops]


def _set_relaxation(ctx: Context, relax: Bound) -> None:
    ctx.time.charge(relax.work_s)
    ctx.bound = relax
    ctx.extra["relaxation"] = {"bound": relax.seconds, "status": relax.status}
    ctx.extra["time_no_recompute"] = ctx.problem.compute_time


def relaxation(ctx: Context) -> str:
    """The live-interval relaxation's bound (``bounds.relaxation_bound``); its proof of infeasibility ends the
    attempt."""
    t, run = ctx.time, ctx.run
    relax_s = max(ctx.settings.min_limit_s, min(t.limit_s / 2, t.left()))
    relax = relaxation_bound(ctx.problem, ctx.budget,
                             CpSatRun(relax_s, run.workers, run.seed, run.deterministic, wall_cap_s=t.wall_left()))
    _set_relaxation(ctx, relax)
    if relax.infeasible:
        ctx.proof = RELAXATION_PROOF
        ctx.ended = f"proven infeasible ({RELAXATION_PROOF})"
        return ctx.ended
    return f"bound {relax.seconds:.6g} s ({relax.status}), {len(relax.evict)} gaps evicted"


def no_relaxation(ctx: Context) -> None:
    """Where the relaxation does not run, the bound is the sum of op times."""
    _set_relaxation(ctx, trivial_bound(ctx.problem, "NOT_RUN"))


def relaxation_guided(ctx: Context) -> str:
    """A greedy run evicting what the relaxation evicts, abandoned after ``guided_share`` of the limit or
    ``guided_max_s`` (on long recompute chains one greedy run can take longer than the limit)."""
    s, t = ctx.settings, ctx.time
    stop_at = min(t.t0 + t.limit_s, time.perf_counter() + min(s.guided_share * t.limit_s, s.guided_max_s))
    assert ctx.bound is not None
    taken = ctx.offer(ctx.polish(guided(ctx.problem, ctx.budget, ctx.bound.evict, stop_at=stop_at)),
                      "relaxation-guided")
    return "a better schedule" if taken else "no better schedule"


def restricted_share(ctx: Context) -> float:
    s, t = ctx.settings, ctx.time
    return min(s.restricted_share * t.limit_s, s.restricted_max_s, t.left())


def restricted_mip(ctx: Context) -> str:
    """CP-SAT where only the ops whose gaps the relaxation evicts may be rematerialised: a model a tenth the size of
    the full one, often solved at the relaxation bound in well under a second (then the schedule is proven optimal
    for the unrestricted problem). If that restriction is infeasible (a recompute may need an evicted input back),
    once more with those ops' inputs added."""
    t0, run, relax, share = time.perf_counter(), ctx.run, ctx.bound, restricted_share(ctx)
    wall_s = ctx.time.wall_left()
    assert relax is not None
    ops = frozenset(u for u, _ in relax.evict)
    cp_run = CpSatRun(share, run.workers, run.seed, run.deterministic, wall_cap_s=wall_s)
    res = solve_mip(ctx.problem, ctx.budget, cp_run, ModelSpec(lower_bound_ticks=relax.ticks, remat_ops=ops))
    used = res.work_s
    if res.status == "INFEASIBLE" and share - used > ctx.settings.min_step_s:
        ops |= {w for u in ops for w in ctx.problem.inputs[u]}
        cp_run = replace(cp_run, time_limit_s=share - used, wall_cap_s=wall_s - (time.perf_counter() - t0))
        res = solve_mip(ctx.problem, ctx.budget, cp_run, ModelSpec(lower_bound_ticks=relax.ticks, remat_ops=ops))
        used += res.work_s
    replay_time = ctx.valid(res.events)
    ctx.extra["restricted_mip"] = {
        "status": res.status, "remat_ops": len(ops), "replay_time": replay_time,
        "at_bound": replay_time is not None and objective_ticks(ctx.problem, res.events) <= relax.ticks,
        "wall_seconds": round(time.perf_counter() - t0, 3), "variables": res.stats.get("variables")}
    ctx.time.charge(used)
    taken = ctx.offer(ctx.polish(None if replay_time is None else res.events), "relaxation-restricted-mip")
    return f"{res.status}; {'a better schedule' if taken else 'no better schedule'}"


@dataclass(frozen=True)
class StagedPlan:
    """How the staged bound runs: its seconds, and the hint of CP-SAT beside it (None: nothing beside)."""

    share_s: float
    beside: Events | None


def staged_plan(ctx: Context) -> StagedPlan | None:
    """Seconds for the staged model, or None if the problem is too big or too little time is left. With 2+ workers,
    deterministic, and a usable hint, CP-SAT from the incumbent goes beside it (one worker each) and it may use all
    that is left; otherwise CP-SAT runs after it (its workers interleaved) and it gets at most ``staged_share`` of
    the limit."""
    s, t, run = ctx.settings, ctx.time, ctx.run
    if staged_variables(ctx.problem) > s.staged_variables_per_second * t.limit_s:
        return None
    assert ctx.bound is not None
    hint = cp_hint(ctx.problem, ctx.incumbent.events, ctx.bound.seconds, s, run.copies)
    beside = hint if run.workers >= 2 and run.deterministic else None
    left = t.left()
    share = left if beside is not None else min(s.staged_share * t.limit_s, left - s.mip_min_share * t.limit_s)
    return StagedPlan(share, beside) if share >= s.min_step_s else None


def _staged_model(ctx: Context, share_s: float, schedule_ticks: int) -> tuple[Bound, Polished]:
    """The staged model for ``share_s`` seconds (summary in the extra), stopped once its bound proves the schedule of
    ``schedule_ticks``: its bound, and the events of its last solution polished, if they fit the budget."""
    t0, run = time.perf_counter(), ctx.run
    staged_run = CpSatRun(share_s, seed=run.seed, deterministic=run.deterministic, wall_cap_s=ctx.time.wall_left())
    staged, solution = solve_staged(ctx.problem, ctx.budget, staged_run, schedule_ticks)
    events, replayed = (staged_events(ctx.problem, solution), None) if solution is not None else (None, None)
    if events is not None:
        try:
            replayed = replay(ctx.problem, events, ctx.budget).time
        except ScheduleError:  # memory inside a stage is counted only in part: expected, not a fault
            events = None
    ctx.extra["staged_bound"] = {"bound": staged.seconds, "status": staged.status,
                                 "variables": staged_variables(ctx.problem),
                                 "wall_seconds": round(time.perf_counter() - t0, 3), "schedule_time": replayed}
    return staged, ctx.polish(events)


def staged_bound(ctx: Context) -> str:
    """The staged bound (small problems only), and in deterministic runs with 2+ workers CP-SAT beside it from the
    incumbent, stopped if the staged model proves a schedule. The better bound, and CP-SAT's result if it ran; the
    incumbent takes the staged schedule if it is faster."""
    plan, relax, inc = staged_plan(ctx), ctx.bound, ctx.incumbent
    assert plan is not None and relax is not None and inc.events is not None
    res, stop = None, SearchStop()
    with ThreadPoolExecutor(1) as pool:
        step = CpSatStep(plan.share_s, ctx.time.wall_left(), relax.ticks, plan.beside, workers=1, stop=stop)
        mip = pool.submit(_cpsat_grown, ctx, step) if plan.beside is not None else None
        staged, found = _staged_model(ctx, plan.share_s, objective_ticks(ctx.problem, inc.events))
        ctx.bound = staged if staged.ticks > relax.ticks else relax
        ctx.offer(found, "staged-model")
        if mip is not None:
            if ctx.at_bound():  # proven: CP-SAT's answer is not used
                stop.stop()
            res = mip.result()
    # beside CP-SAT the two ran at once: the longer is charged (CP-SAT is stopped early only by a proof, and then no
    # step follows)
    ctx.time.charge(max(staged.work_s, 0.0 if res is None else res.work_s))
    ctx.mip, ctx.mip_beside = res, res is not None
    beside = f"; CP-SAT beside it: {res.status}" if res is not None else ""
    return f"bound {staged.seconds:.6g} s ({staged.status}){beside}"


def full_cpsat(ctx: Context) -> str:
    """CP-SAT on the full model from the best schedule (as a hint, if usable) and bound, window LNS after its search,
    its grid grown while it is optimal within it."""
    t, bound = ctx.time, ctx.bound
    assert bound is not None
    remaining = max(ctx.settings.min_limit_s, t.left())
    hint = cp_hint(ctx.problem, ctx.incumbent.events, bound.seconds, ctx.settings, ctx.run.copies)
    res = cpsat(ctx, CpSatStep(remaining, t.wall_left(), bound.ticks, hint))
    res = grow_grid(ctx, res, CpSatStep(remaining, t.wall_left(), bound.ticks))
    t.charge(res.work_s)
    ctx.mip = res
    return f"{res.status}, objective {res.objective_s}"


def no_full_cpsat(ctx: Context) -> None:
    """Where CP-SAT does not run (and did not run beside the staged model), the reason in its place."""
    if ctx.mip is None:
        note = ("schedule meets the lower bound" if ctx.at_bound()
                else f"{min(ctx.time.left(), ctx.time.wall_left()):.1f} s left")
        ctx.mip = MipResult(None, "SKIPPED", None, None, 0.0, None, {"note": note})


def improve_found(ctx: Context) -> str:
    """After an attempt shortened because no fast schedule fit (the budget looked infeasible), CP-SAT found one: the
    budget is met, so the rest of the full limit goes to improving that schedule (CP-SAT from it as a hint, then
    window LNS). The better of the two results."""
    t, res, bound = ctx.time, ctx.mip, ctx.bound
    assert res is not None and bound is not None
    res_time = ctx.valid(res.events)
    assert res_time is not None
    t.restore()
    left = min(t.left(), t.wall_left())
    if left < ctx.settings.mip_min_share * t.limit_s:
        return f"not run: {left:.1f} s left"
    if cp_hint(ctx.problem, res.events, bound.seconds, ctx.settings, ctx.run.copies) is None:
        return "not run: CP-SAT's schedule is no usable hint"
    more = cpsat(ctx, CpSatStep(left, t.wall_left(), bound.ticks, res.events))
    t.charge(more.work_s)
    ctx.extra["improve_mip"] = {"status": more.status, "objective_before": res.objective_s,
                                "objective": more.objective_s, "wall_seconds": round(more.wall_s, 3)}
    after = ctx.valid(more.events)
    if after is not None and after < res_time:
        ctx.mip = more
        return f"improved: {after:.6g} s"
    return "no better schedule"


def proven_infeasible(ctx: Context, proof: str) -> Schedule:
    """No schedule, the budget proven infeasible: by the single-op floor where that suffices, else by ``proof``."""
    inc = ctx.incumbent
    ctx.extra.update(heuristic=inc.name or None, heuristic_time=inc.time, first_feasible_seconds=None)
    proof = floor_proof(ctx.problem, ctx.budget) or proof
    sched = no_schedule(ctx.budget, "ours", ctx.time.elapsed(), f"proven infeasible ({proof})", ctx.extra)
    return set_budget_status(sched, "proven_infeasible", proof)


def answer(ctx: Context) -> Schedule:
    """The attempt's answer: the better of CP-SAT's schedule (polished) and the incumbent, with the best valid bound
    and the extras; or where a proof ended the attempt, no schedule."""
    if ctx.proof is not None:
        return proven_infeasible(ctx, ctx.proof)
    inc, res, bound, extra = ctx.incumbent, ctx.mip, ctx.bound, ctx.extra
    assert res is not None and bound is not None
    proven = ctx.at_bound()
    extra.update(heuristic=inc.name or None, heuristic_time=inc.time)
    mip_events, mip_time = ctx.polish(res.events)
    first = inc.first
    if first is None and res.first_solution_s is not None:
        first = ctx.time.elapsed() - res.wall_s + res.first_solution_s
    extra["mip"] = {"status": res.status, "objective": res.objective_s, "bound": res.bound_s,
                    "wall_seconds": round(res.wall_s, 3), "replay_time": mip_time, **res.stats}
    extra["first_feasible_seconds"] = first
    # CP-SAT's own bound holds for its model (at most C copies per op, K remat slots per block), not for every
    # schedule; only the relaxation bounds are reported, and only a schedule at them is "optimal". CP-SAT's
    # "optimal" within its model is said in the extra.
    elapsed = ctx.time.elapsed()
    if not proven and mip_time is not None and (inc.time is None or mip_time <= inc.time):
        at_bound = objective_ticks(ctx.problem, mip_events) <= bound.ticks  # proven even if CP-SAT did not notice
        if res.status == "OPTIMAL" and not at_bound:
            extra["optimal_within"] = (f"the CP-SAT model: {res.stats.get('copies')} copies per op, "
                                       f"{res.stats.get('slots')} remat slots per block")
        sched = from_events(ctx.problem, mip_events, method="ours", solve_seconds=elapsed,
                            optimality=Optimality(bound.seconds, at_bound), extra=extra)
    elif inc.events is not None:
        sched = from_events(ctx.problem, inc.events, method="ours", solve_seconds=elapsed,
                            optimality=Optimality(bound.seconds, proven), extra=extra)
    else:
        note = ("no schedule found: the CP-SAT model (at most C copies per op, K remat slots per block) is "
                "infeasible; not a proof for the unrestricted problem" if res.status == "INFEASIBLE"
                else "no schedule found within the time limit")
        sched = no_schedule(ctx.budget, "ours", elapsed, note, extra)
    return set_budget_status(sched, "met" if sched.ok else "not_found")

