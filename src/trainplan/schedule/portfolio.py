"""The scheduler's portfolio as data: every strategy of method "ours", in the order it runs, with the conditions under
which it applies.

:data:`PORTFOLIO` lists them: fast schedules first (a valid schedule at once), then the bounds and the improvements
(CP-SAT), and last the bisection, which raises a budget no schedule met and runs the strategies before it again there.
A strategy runs where all its conditions hold; some are known before solving (the problem's shape, the limit), others
depend on what ran before (whether a fast schedule fits, the time left). :func:`run_portfolio` runs the list on a
:class:`~trainplan.schedule.context.Context` and records every strategy, ran or skipped and why, in the schedule's
``extra["strategies"]``; :func:`explain` says before solving which will run and why (``trainplan schedule --explain``).
What each strategy does is in ``schedule/fast.py``, ``schedule/improve.py`` and ``schedule/bisection.py``; the tuning
in ``schedule/settings.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from trainplan.schedule import bisection, fast, improve
from trainplan.schedule import deadline as dl
from trainplan.schedule.bounds import floor_proof
from trainplan.schedule.chain_dp import chain_length
from trainplan.schedule.context import Context, FastOptions, RunOptions, Step
from trainplan.schedule.heuristic import Events
from trainplan.schedule.last_compute import not_applicable
from trainplan.schedule.problem import Problem
from trainplan.schedule.schedule_io import Schedule
from trainplan.schedule.scratch import scratch_bound
from trainplan.schedule.settings import DEFAULTS, PortfolioSettings
from trainplan.schedule.staged_bound import staged_variables

FAST, BOUND, IMPROVEMENT, BISECTION = "fast schedule", "bound", "improvement", "bisection"


@dataclass(frozen=True)
class Condition:
    """What must hold for a strategy to run, in words (``when``); ``fails(ctx)`` says why it does not hold now (None:
    it holds). ``known_before``: decided by the problem, the limit and the options alone, so :func:`explain` evaluates
    it; otherwise it depends on the strategies before it, and the explanation says "runs if ..."."""

    when: str
    fails: Callable[[Context], str | None]
    known_before: bool = True


def condition(when: str, holds: Callable[[Context], bool], unless: str, known_before: bool = True) -> Condition:
    """A condition that either holds or fails for the one reason ``unless``."""
    return Condition(when, lambda ctx: None if holds(ctx) else unless, known_before)


@dataclass(frozen=True)
class Strategy:
    """One entry of the portfolio: its name in words, its phase, the conditions under which it runs (all must hold),
    what it does (``run``, returning a line on what it gave), and what stands in its place where it is skipped."""

    name: str
    phase: str
    run: Callable[[Context], str | None]
    conditions: tuple[Condition, ...] = ()
    otherwise: Callable[[Context], None] | None = None


def _scratch_fails(ctx: Context) -> str | None:
    bound = scratch_bound(ctx.problem)
    if bound is None:
        return "an op cannot be recomputed"
    if fast.scratch_fits(ctx, bound):
        return None
    return (f"the budget is below its bound ({bound.bytes} B) and its {bound.computes:.3g} uncached computes exceed "
            f"its work cap ({fast.scratch_cap(ctx):.3g})")


def _staged_size_fails(ctx: Context) -> str | None:
    variables, rate = staged_variables(ctx.problem), ctx.settings.staged_variables_per_second
    if variables <= rate * ctx.time.limit_s:
        return None
    return f"its model has {variables} variables, over {rate} per second of the {ctx.time.limit_s:g} s limit"


def _wall_fails(ctx: Context) -> str | None:
    left = ctx.time.wall_left()
    return None if left > ctx.settings.min_step_s else f"{left:.2f} s of wall time left"


def _cpsat_time_fails(ctx: Context) -> str | None:
    t, share = ctx.time, ctx.settings.mip_min_share
    if ctx.incumbent.events is None or t.left() >= share * t.limit_s:
        return None
    return f"{t.left():.1f} s left, under {share:.0%} of the limit"


CHAIN_DP_ON = condition("not a bisection probe",
                        lambda c: c.fast.chain_dp, "a bisection probe runs the DP at least memory itself")
ADJOINT_CHAIN = condition("the problem is an adjoint chain", lambda c: chain_length(c.problem) is not None,
                          "not an adjoint chain")
CAN_SWAP = condition("some op can be swapped", lambda c: c.can_swap, "no op can be swapped")
NO_SCHEDULE_YET = condition("no fast schedule fits", lambda c: c.incumbent.events is None, "a fast schedule fits",
                            known_before=False)
SCRATCH_WORTH = Condition("every op can be recomputed, and the budget is at least the run's bound or its uncached "
                          "computes fit its work cap", _scratch_fails)
LAST_COMPUTE_APPLIES = Condition("every op can be recomputed, no further outputs, every op needed by the keep set",
                                 lambda c: not_applicable(c.problem))
ON_TIME = condition("the greedy runs end within the heuristics' share", lambda c: not c.fast_run.out_of_time,
                    "the greedy runs used the heuristics' share", known_before=False)
CALL_TIME = condition("the call's deadline has not passed", lambda c: not c.fast_run.call.passed(),
                      "the call's deadline has passed", known_before=False)
FINAL_RUN = condition("a bisection's run at the budget it found", lambda c: c.start is not None,
                      "not a bisection's final run")
BISECTING = condition("the bisection is on, in the first attempt", lambda c: c.fast.first_deadline_s is not None,
                      "the bisection is off or this is its final run")
REORDERED = condition("the first schedule's first computes are out of program order (the last-compute search's)",
                      improve.reordered, "the first computes are in program order", known_before=False)
WALL_LEFT = Condition("wall time is left (at least min_step_s)", _wall_fails, known_before=False)
EVICTS = condition("the relaxation evicts some gap", lambda c: c.bound is not None and bool(c.bound.evict),
                   "the relaxation evicts nothing", known_before=False)
RESTRICTED_TIME = condition(
    "its share of the limit is left (restricted_share, at most restricted_max_s)",
    lambda c: min(improve.restricted_share(c), c.time.wall_left()) > c.settings.min_step_s, "too little time left",
    known_before=False)
NOT_AT_BOUND = condition("no schedule meets the bound yet", lambda c: not c.at_bound(),
                         "the best schedule meets the bound: it is optimal", known_before=False)
ABOVE_BOUND = condition("the best schedule is above the bound",
                        lambda c: c.incumbent.events is not None and not c.at_bound(),
                        "no schedule, or it meets the bound", known_before=False)
STAGED_SMALL = Condition("its model has at most staged_variables_per_second variables per second of the limit",
                         _staged_size_fails)
STAGED_TIME = condition("its share of the limit is left (all of it beside CP-SAT, else staged_share)",
                        lambda c: improve.staged_plan(c) is not None, "too little time left", known_before=False)
NOT_BESIDE = condition("CP-SAT did not run beside the staged model", lambda c: not c.mip_beside,
                       "CP-SAT ran beside the staged model", known_before=False)
CPSAT_TIME = Condition("there is no schedule yet or mip_min_share of the limit is left", _cpsat_time_fails,
                       known_before=False)
SHORTENED = condition("the attempt was shortened for the bisection (no fast schedule fit)", lambda c: c.time.shortened,
                      "the attempt was not shortened", known_before=False)
CPSAT_FOUND = condition("CP-SAT found a schedule", lambda c: c.mip is not None and c.valid(c.mip.events) is not None,
                        "CP-SAT found no schedule", known_before=False)
BISECT_ON = condition("the bisection is on", lambda c: c.run.bisect, "the bisection is off")
UNMET = condition("no schedule met the requested budget",
                  lambda c: c.schedule is None or not c.schedule.ok, "a schedule met the requested budget",
                  known_before=False)


def _keep_time_for_bisection(ctx: Context) -> str:
    assert ctx.fast.first_deadline_s is not None
    ctx.time.shorten(ctx.fast.first_deadline_s)
    return f"the attempt's limit is now {ctx.time.limit_s:.3g} s; the rest goes to the bisection"


def _bisect(ctx: Context) -> str:
    return bisection.bisect(ctx, run_attempt, first_schedule)


PORTFOLIO: tuple[Strategy, ...] = (
    Strategy("chain DP (revolve-style, adjoint chains)", FAST, fast.chain_dp, (CHAIN_DP_ON, ADJOINT_CHAIN)),
    Strategy("swap-only greedy runs (Belady, then least restore cost)", FAST, fast.swap_only_greedy, (CAN_SWAP,)),
    Strategy("DTR-style eviction plan, refined by ruin and recreate", FAST, fast.dtr_with_swaps),
    Strategy("DTR-style eviction plan, recompute only", FAST, fast.dtr_recompute_only, (CAN_SWAP,)),
    Strategy("recomputing from scratch", FAST, fast.scratch_recompute, (NO_SCHEDULE_YET, SCRATCH_WORTH)),
    Strategy("last-compute search (first computes in any order)", FAST, fast.last_compute,
             (NO_SCHEDULE_YET, LAST_COMPUTE_APPLIES)),
    Strategy("greedy runs (eviction policies x swap/recompute options)", FAST, fast.greedy_runs),
    Strategy("sqrt(n) checkpointing", FAST, fast.sqrt_checkpoint, (ON_TIME, CALL_TIME)),
    Strategy("keep time for the bisection", BISECTION, _keep_time_for_bisection, (BISECTING, NO_SCHEDULE_YET)),
    Strategy("the bisection's schedule", FAST, fast.bisection_start, (FINAL_RUN,)),
    Strategy("program order of the first schedule", BOUND, improve.in_first_compute_order, (REORDERED,)),
    Strategy("live-interval relaxation (lower bound)", BOUND, improve.relaxation, (WALL_LEFT,),
             otherwise=improve.no_relaxation),
    Strategy("relaxation-guided greedy run", IMPROVEMENT, improve.relaxation_guided, (EVICTS,)),
    Strategy("CP-SAT restricted to the relaxation's evicted ops", IMPROVEMENT, improve.restricted_mip,
             (EVICTS, RESTRICTED_TIME, NOT_AT_BOUND)),
    Strategy("staged bound (CP-SAT beside it with 2+ workers, deterministic)", BOUND, improve.staged_bound,
             (ABOVE_BOUND, STAGED_SMALL, STAGED_TIME)),
    Strategy("CP-SAT on the full model (hint, window LNS, grid growth)", IMPROVEMENT, improve.full_cpsat,
             (NOT_BESIDE, NOT_AT_BOUND, CPSAT_TIME, WALL_LEFT), otherwise=improve.no_full_cpsat),
    Strategy("CP-SAT from its schedule for the rest of the limit", IMPROVEMENT, improve.improve_found,
             (SHORTENED, NOT_AT_BOUND, CPSAT_FOUND)),
    Strategy("bisection to the smallest feasible budget, then the strategies above there", BISECTION, _bisect,
             (BISECT_ON, UNMET)),
)


def _step(ctx: Context, strategy: Strategy, in_attempt: bool = True) -> None:
    """Run ``strategy`` if the attempt goes on and its conditions hold; record it in the trace either way."""
    if in_attempt and ctx.ended is not None:
        ctx.trace.append(Step(strategy.name, strategy.phase, False, ctx.ended))
        return
    for cond in strategy.conditions:
        why_not = cond.fails(ctx)
        if why_not is not None:
            ctx.trace.append(Step(strategy.name, strategy.phase, False, why_not))
            if strategy.otherwise is not None:
                strategy.otherwise(ctx)
            return
    why = "; ".join(cond.when for cond in strategy.conditions) or "always"
    result = strategy.run(ctx)
    ctx.trace.append(Step(strategy.name, strategy.phase, True, why, result, ctx.final_run))


def _is_bisection(strategy: Strategy) -> bool:
    return strategy.run is _bisect


def run_attempt(ctx: Context) -> Schedule:
    """Every strategy but the bisection at the context's budget, and the answer: the best replay-valid schedule with
    the best proven bound."""
    for strategy in PORTFOLIO:
        if not _is_bisection(strategy):
            _step(ctx, strategy)
    return improve.answer(ctx)


def first_schedule(ctx: Context) -> Events | None:
    """The fast schedules at the context's budget, as a bisection's probe runs them: the first that fits."""
    for strategy in PORTFOLIO:
        if strategy.phase == FAST:
            _step(ctx, strategy)
    return ctx.incumbent.events


def top_context(problem: Problem, time_limit_s: float, run: RunOptions) -> Context:
    """The context of a call of method "ours" at ``problem.budget_bytes``: where the budget is below the memory floor
    and the bisection is on, the attempt there is over before it starts."""
    ctx = Context.create(problem, dl.TimeBudget(time_limit_s, run.deterministic, time_limit_s), run,
                         FastOptions.attempt(time_limit_s, run.settings, keep_for_bisection=run.bisect))
    if run.bisect and problem.budget_bytes < problem.floor_bytes:  # no schedule can exist: straight to the bisection
        ctx.below_floor, ctx.proof = True, floor_proof(problem, problem.budget_bytes)
        ctx.ended = f"the budget is below the memory floor ({problem.floor_bytes} B): straight to the bisection"
    return ctx


def run_portfolio(ctx: Context) -> Schedule:
    """The portfolio on ``ctx`` (see :func:`top_context`): the attempt at the requested budget, then the bisection
    where it applies. The schedule records every strategy in ``extra["strategies"]``."""
    ctx.schedule = run_attempt(ctx)
    for strategy in PORTFOLIO:
        if _is_bisection(strategy):
            _step(ctx, strategy, in_attempt=False)
    sched = ctx.schedule
    sched.extra["strategies"] = [step.to_dict() for step in ctx.trace]
    return sched


class FastResult(NamedTuple):
    """The best fast schedule, its origin, seconds to the first valid one; ``proof``: where the last-compute search
    proved that no schedule fits."""

    events: Events | None
    name: str
    first_s: float | None
    proof: str | None = None


def best_heuristic(problem: Problem, options: FastOptions = FastOptions(), allowance: dl.Allowance | None = None,
                   settings: PortfolioSettings = DEFAULTS) -> FastResult:
    """The fast schedules of the portfolio alone at ``problem.budget_bytes`` (see :class:`FastOptions`; a probe's work
    is charged to ``allowance``)."""
    ctx = Context.detached(problem, options, allowance, RunOptions(settings=settings))
    first_schedule(ctx)
    inc = ctx.incumbent
    return FastResult(inc.events, inc.name, inc.first, ctx.proof)


class Explained(NamedTuple):
    """One line of :func:`explain`: the strategy, its phase, "runs" / "runs if ..." / "skipped", and why (the
    conditions known to hold, or the reason it is skipped)."""

    name: str
    phase: str
    verdict: str
    why: str


def explain(problem: Problem, time_limit_s: float, run: RunOptions = RunOptions()) -> list[Explained]:
    """Which strategies of the portfolio will run on ``problem`` at its budget within ``time_limit_s``, and why,
    decided before solving: conditions known before solving are evaluated, the others (which depend on the
    strategies before) are named ("runs if no fast schedule fits")."""
    ctx = top_context(problem, time_limit_s, run)
    out = []
    for strategy in PORTFOLIO:
        if ctx.ended is not None and not _is_bisection(strategy):
            out.append(Explained(strategy.name, strategy.phase, "skipped", ctx.ended))
            continue
        known = [(cond, cond.fails(ctx)) for cond in strategy.conditions if cond.known_before]
        failed = [why for _, why in known if why is not None]
        if failed:
            out.append(Explained(strategy.name, strategy.phase, "skipped", failed[0]))
            continue
        later = [cond.when for cond in strategy.conditions if not cond.known_before]
        verdict = "runs if " + " and ".join(later) if later else "runs"
        out.append(Explained(strategy.name, strategy.phase, verdict, "; ".join(cond.when for cond, _ in known)))
    return out


def explanation_text(problem: Problem, time_limit_s: float, run: RunOptions = RunOptions()) -> str:
    """:func:`explain` as text, one line per strategy, with a head naming the problem, the budget and the limit."""
    lines = [f"{problem.n} ops, budget {problem.budget_bytes} B (memory floor {problem.floor_bytes} B), time limit "
             f"{time_limit_s:g} s, {run.workers} worker(s), seed {run.seed}, "
             f"{'deterministic' if run.deterministic else 'nondeterministic'}, "
             f"bisection {'on' if run.bisect else 'off'}; the strategies in the order they run:"]
    for i, line in enumerate(explain(problem, time_limit_s, run), 1):
        lines.append(f"{i:2d}. [{line.phase}] {line.name}: {line.verdict}" + (f" ({line.why})" if line.why else ""))
    return "\n".join(lines)
