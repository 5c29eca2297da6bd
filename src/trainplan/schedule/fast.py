"""The fast schedules of the portfolio: each strategy's run on a :class:`~trainplan.schedule.context.Context`.

Which of them run, in which order and when, is said in ``schedule/portfolio.py``; here is what each does. Each
offers its schedule to the context's incumbent (kept if it is valid and faster) and returns a line on what it gave.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from trainplan.schedule import baselines
from trainplan.schedule.chain_dp import chain_dp_events
from trainplan.schedule.context import Context, Polished
from trainplan.schedule.dtr import DtrOptions, Effort, dtr_plan
from trainplan.schedule.heuristic import INF, POLICIES, Events, Limits, Simulator
from trainplan.schedule.last_compute import search as last_compute_search
from trainplan.schedule.mip import hint_growth
from trainplan.schedule.problem import Problem
from trainplan.schedule.replay import replay
from trainplan.schedule.scratch import ScratchBound, scratch_bound, scratch_events
from trainplan.schedule.settings import PortfolioSettings

GREEDY_VARIANTS = {"swap+recompute": (True, True), "recompute": (False, True), "swap": (True, False)}


class GreedyVariant(NamedTuple):
    label: str
    allow_swap: bool
    allow_recompute: bool
    policy: str


def greedy_variants(problem: Problem) -> list[GreedyVariant]:
    """The greedy runs that differ on ``problem``: a variant whose options this problem's flags make equal to an
    earlier one's (swap+recompute where no op can be swapped) runs once. The swap-only runs come first, one per
    policy, Belady first: they take milliseconds, and where every op can be swapped they meet any budget at or above
    the memory floor (the swap_only baseline is the best of them, so ours is never worse than it)."""
    can_swap, can_rc = any(op.swap for op in problem.ops), any(op.recompute for op in problem.ops)
    swap_first = [GreedyVariant("swap", True, False, policy) for policy in ("belady", *POLICIES)]
    runs = swap_first + [GreedyVariant(label, s, r, policy) for label, (s, r) in GREEDY_VARIANTS.items()
                         for policy in POLICIES]
    seen: set[tuple[bool, bool, str]] = set()
    kept = []
    for run in runs:
        swaps, recomputes = run.allow_swap and can_swap, run.allow_recompute and can_rc
        key = (swaps, recomputes, run.policy if swaps or recomputes else "")  # no eviction: the policy is moot
        if key not in seen:
            seen.add(key)
            kept.append(run)
    return kept


def refine_share(problem: Problem, settings: PortfolioSettings) -> float:
    """Ruin and recreate's work, as a share of the heuristics' time (see ``refine_large_edges``)."""
    large = sum(map(len, problem.inputs)) > settings.refine_large_edges
    return settings.refine_large_share if large else settings.refine_share


def cp_hint(problem: Problem, events: Events | None, bound_s: float, settings: PortfolioSettings,
            copies: int | None = None) -> Events | None:
    """``events`` as a CP-SAT hint; None where they take more than ``hint_max_over_bound`` times the lower bound
    ``bound_s``, or fitting them would grow the model more than ``hint_max_growth`` times
    (:func:`mip.hint_growth`)."""
    if events is None or replay(problem, events).time > settings.hint_max_over_bound * bound_s:
        return None
    return events if hint_growth(problem, events, copies) <= settings.hint_max_growth else None


def _found(ctx: Context) -> str:
    inc = ctx.incumbent
    return "nothing within the budget" if inc.time is None else f"best so far: {inc.name}, {inc.time:.6g} s"


def chain_dp(ctx: Context) -> str:
    """The revolve-style DP on an adjoint chain (``schedule/chain_dp.py``)."""
    ctx.offer(ctx.polish(chain_dp_events(ctx.problem, ctx.budget)), "chain-dp")
    return _found(ctx)


def least_memory_chain(ctx: Context) -> Events | None:
    """A bisection probe on an adjoint chain: one DP run holds the cost at every smaller memory; its least-memory
    schedule, if valid within the budget."""
    events = chain_dp_events(ctx.problem, ctx.budget, least_memory=True)
    return events if ctx.valid(events) is not None else None


def _greedy(ctx: Context, variant: GreedyVariant) -> bool:
    """One greedy run, kept if it is the best so far; True if it was. Once one is valid, a swap-only run stops only
    at the call's deadline, as the swap_only baseline does (so ours is never worse than it)."""
    fr, opts, inc, rate = ctx.fast_run, ctx.fast, ctx.incumbent, ctx.settings.probe_greedy_per_second
    cap = opts.greedy_work if ctx.allowance is None else min(opts.greedy_work or INF, ctx.allowance.units(rate))
    end = fr.call.end if variant.label == "swap" else min(fr.call.end, fr.stop_at or fr.call.end)
    limits = Limits(fr.first_stop.end if inc.time is None else end,
                    time_cap=inc.time,  # a run slower than the best stops
                    work_cap=cap)
    sim = Simulator(ctx.problem, ctx.budget, allow_swap=variant.allow_swap, allow_recompute=variant.allow_recompute,
                    policy=variant.policy, limits=limits)
    events = sim.run()
    if ctx.allowance is not None:
        ctx.allowance.charge(sim.work_done, rate)
    return ctx.offer(ctx.polish(events), f"greedy-{variant.policy}-{variant.label}")


def _variants(ctx: Context) -> list[GreedyVariant]:
    """The greedy variants not yet run (all of :func:`greedy_variants` at first)."""
    if ctx.fast_run.variants is None:
        ctx.fast_run.variants = greedy_variants(ctx.problem)
    return ctx.fast_run.variants


def swap_only_greedy(ctx: Context) -> str:
    """The swap-only greedy runs (Belady, then the cost policy): a first schedule in milliseconds."""
    variants = _variants(ctx)
    while variants and variants[0].label == "swap" and not ctx.ended:
        _greedy(ctx, variants.pop(0))
    return _found(ctx)


def _dtr(ctx: Context, allow_swap: bool) -> str:
    """The DTR-style eviction plan (``schedule/dtr.py``), refined by ruin and recreate for a fixed amount of work."""
    s, opts, fr, n = ctx.settings, ctx.fast, ctx.fast_run, ctx.problem.n
    deadline_s = opts.deadline_s
    restarts = 0 if deadline_s is None else min(s.dtr_max_restarts, int(deadline_s * s.dtr_ops_per_second / n))
    share = refine_share(ctx.problem, s)
    refine = 0 if deadline_s is None else int(share * deadline_s * s.refine_work_per_second)
    meter, found = [0], []
    options = DtrOptions(allow_swap, restarts, refine=refine, holds=not opts.first_only,
                         refine_wall_s=None if deadline_s is None else s.wall_safety * share * deadline_s)
    effort = Effort(fr.first_stop if ctx.incumbent.time is None else fr.call, meter,
                    INF if ctx.allowance is None else ctx.allowance.units(s.probe_dtr_per_second))
    events = dtr_plan(ctx.problem, ctx.budget, options, effort, found)
    if ctx.allowance is not None:
        ctx.allowance.charge(meter[0], s.probe_dtr_per_second)
    # the plan's events are polished already; it was valid before its refinement
    taken = ctx.offer(Polished(events, ctx.valid(events)), "dtr-plan" if allow_swap else "dtr-plan-recompute",
                      first_at=found[0] if found else None)
    return f"{'a' if taken else 'no'} better schedule; " + _found(ctx)


def dtr_with_swaps(ctx: Context) -> str:
    return _dtr(ctx, allow_swap=True)


def dtr_recompute_only(ctx: Context) -> str:
    return _dtr(ctx, allow_swap=False)


def scratch_cap(ctx: Context) -> float:
    """The run from scratch's work cap: ``scratch_work_per_second`` x the heuristics' share (none without one), and
    in a bisection's probe at most what the allowance covers."""
    s, deadline_s = ctx.settings, ctx.fast.deadline_s
    cap = INF if deadline_s is None else deadline_s * s.scratch_work_per_second
    return cap if ctx.allowance is None else min(cap, ctx.allowance.units(s.scratch_work_per_second))


def scratch_fits(ctx: Context, bound: ScratchBound | None) -> bool:
    """Recomputing from scratch is tried where its uncached run's computes fit its cap, or, outside a probe, where
    the budget is at least its bound: there it meets the budget given the work, and the slack as a cache makes it far
    cheaper (on the 500-op layered DAGs at 70% of the plain peak, 1.3-3.3M units against 1.2-1.5e8 computes
    uncached). A probe that ran out of work would spend what the other probes need."""
    return bound is not None and not (bound.computes > scratch_cap(ctx)
                                      and (ctx.allowance is not None or ctx.budget < bound.bytes))


def from_scratch(ctx: Context) -> Polished:
    """The polished run recomputing from scratch (scratch.scratch_events) within its cap (:func:`scratch_cap`), its
    work charged to the allowance (a probe's); nothing where :func:`scratch_fits` says it is not worth trying. It
    stops at the fast schedules' deadline before a first schedule."""
    bound = scratch_bound(ctx.problem)  # one pass over the edges: 16 ms on a 2000-op layered DAG
    if not scratch_fits(ctx, bound):
        return Polished(None, None)
    meter = [0]
    events = scratch_events(ctx.problem, ctx.budget, work_cap=scratch_cap(ctx), stop=ctx.fast_run.first_stop,
                            meter=meter, bound=bound)
    if ctx.allowance is not None:
        ctx.allowance.charge(meter[0], ctx.settings.scratch_work_per_second)
    return ctx.polish(events)


def scratch_recompute(ctx: Context) -> str:
    """Recomputing from scratch: slow schedules, but they fit budgets where nothing above does."""
    ctx.offer(from_scratch(ctx), "scratch-recompute")
    return _found(ctx)


def last_compute(ctx: Context) -> str:
    """The last-compute search within its cap (``search_work_per_second`` x the heuristics' share, and in a probe at
    most ``probe_search_share`` of the allowance, charged). Where no op can be swapped and the search ends without a
    schedule, its proof ends the attempt: no schedule fits."""
    s, opts = ctx.settings, ctx.fast
    cap = INF if opts.deadline_s is None else opts.deadline_s * s.search_work_per_second
    if ctx.allowance is not None:
        cap = min(cap, s.probe_search_share * ctx.allowance.units(s.search_work_per_second))
    if cap < 1:
        return "no work left for it"
    found = last_compute_search(ctx.problem, ctx.budget, max_work=int(min(cap, 2**62)), stop=ctx.fast_run.first_stop)
    if ctx.allowance is not None:
        ctx.allowance.charge(found.work, s.search_work_per_second)
    if found.status == "infeasible" and not ctx.can_swap:
        ctx.proof = (f"last-compute search: no recompute-only schedule fits, first computes in any order "
                     f"(the search ended after {found.states} sets)")
        ctx.ended = f"proven infeasible ({ctx.proof})"
        return ctx.ended
    ctx.offer(ctx.polish(found.events), "last-compute-search")
    return f"{found.status} after {found.states} sets; " + _found(ctx)


def greedy_runs(ctx: Context) -> str:
    """The other greedy variants (policies x swap/recompute options), until the heuristics' share is used."""
    fr, opts, variants, ran = ctx.fast_run, ctx.fast, _variants(ctx), 0
    while variants:
        ran += 1
        if _greedy(ctx, variants.pop(0)) and ctx.ended:
            break
        over = (ctx.incumbent.time is not None and opts.deadline_s is not None
                and time.perf_counter() - fr.t0 > opts.deadline_s)
        if over or (fr.first_stop if ctx.incumbent.time is None else fr.call).passed():
            fr.out_of_time = True
            break
    return f"{ran} run(s){', out of time' if fr.out_of_time else ''}; " + _found(ctx)


def sqrt_checkpoint(ctx: Context) -> str:
    """sqrt(n) checkpointing (Chen et al. 2016), kept if it fits the budget (often it does not)."""
    events = baselines.sqrt_checkpoint_events(ctx.problem)
    if events is None or replay(ctx.problem, events).peak_bytes > ctx.budget:
        return "over the budget"
    ctx.offer(ctx.polish(events), "sqrt_checkpoint")
    return _found(ctx)


def bisection_start(ctx: Context) -> str:
    """The bisection's schedule at this budget (its final run), polished: the schedule to improve."""
    ctx.offer(ctx.polish(ctx.start), "bisection-probe")
    return _found(ctx)


