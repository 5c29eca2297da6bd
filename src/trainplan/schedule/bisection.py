"""The bisection of the portfolio: where no schedule met the requested budget, the smallest feasible budget found
between the memory floor and the plain peak, and the portfolio's run there from the bisection's schedule.

Its probes run the fast schedules (first schedule only, charged to a deterministic work allowance) and a few short
CP-SAT runs; the run at the found budget is the portfolio's attempt again (both handed in by
``schedule/portfolio.py``, which lists the strategies).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trainplan.schedule import baselines
from trainplan.schedule import deadline as dl
from trainplan.schedule import fast
from trainplan.schedule.context import Context, FastOptions
from trainplan.schedule.dtr import Effort, raised_plan
from trainplan.schedule.heuristic import Events
from trainplan.schedule.mip import CpSatRun, ModelSpec, solve_mip
from trainplan.schedule.replay import replay
from trainplan.schedule.schedule_io import Schedule, set_budget_status
from trainplan.schedule.scratch import scratch_bound
from trainplan.schedule.settings import DEFAULTS, PortfolioSettings

Attempt = Callable[[Context], Schedule]  # the portfolio's strategies at a context's budget, and the answer
FirstSchedule = Callable[[Context], Events | None]  # the fast schedules in a probe: the first that fits


def min_feasible_budget(probe: Callable[[int], int | None], lo: int, hi: int, settings: PortfolioSettings = DEFAULTS,
                        deadline: float | None = None, spent: Callable[[], bool] | None = None) -> int:
    """Smallest budget in (lo, hi] that ``probe`` finds a schedule for (lo fails, hi passes), to ``bisect_tolerance``:
    the first probe sits ``bisect_split`` of the way up from lo, the others halfway. ``probe(b)`` returns the peak of
    a schedule within b (so hi drops to that peak at once), or None. Once ``spent()`` (the probes' deterministic
    allowance), or past the ``deadline`` (a perf_counter time; a wall-clock safety net): the best so far."""
    split = settings.bisect_split
    while hi - lo > max(1, int(settings.bisect_tolerance * hi)):
        if (deadline is not None and time.perf_counter() > deadline) or (spent is not None and spent()):
            break
        mid = min(hi - 1, lo + max(1, int(split * (hi - lo))))
        peak, split = probe(mid), 0.5
        if peak is None:
            lo = mid
        else:
            hi, lo = peak, min(lo, peak - 1)
    return hi


@dataclass
class _Probes:
    """The bisection's state: the top-level context, its allowance, the schedules found by peak and when (seconds
    from the call's start), and the CP-SAT probes run."""

    ctx: Context
    allowance: dl.Allowance
    first_schedule: FirstSchedule
    found: dict[int, Events] = field(default_factory=dict)
    found_at: dict[int, float] = field(default_factory=dict)
    mip_probes: int = 0

    def at(self, budget: int, options: FastOptions = FastOptions()) -> Context:
        """A probe's context at ``budget``, drawing on the allowance."""
        return Context.detached(self.ctx.problem.with_budget(budget), options, self.allowance, self.ctx.run)

    def keep(self, events: Events) -> int:
        peak = replay(self.ctx.problem, events).peak_bytes
        self.found[peak], self.found_at[peak] = events, self.ctx.time.elapsed()
        return peak

    def probe(self, budget: int) -> int | None:
        """The peak of a schedule within ``budget`` (chain DP at least memory, the fast schedules' first, a short
        CP-SAT run), or None."""
        s, run = self.ctx.settings, self.ctx.run
        pctx = self.at(budget, FastOptions(first_only=True, chain_dp=False,
                                           greedy_work=s.probe_greedy_work_per_op * self.ctx.problem.n))
        events = fast.least_memory_chain(pctx)
        if events is None:
            events = self.first_schedule(pctx)
        if events is None and self.mip_probes < s.max_mip_probes and not self.allowance.spent():
            self.mip_probes += 1
            probe_s = max(s.min_limit_s, s.probe_share * self.ctx.time.full_limit_s)
            self.allowance.charge(probe_s, 1.0)  # a CP-SAT probe: its limit
            events = solve_mip(pctx.problem, budget, CpSatRun(probe_s, run.workers, run.seed, run.deterministic),
                               ModelSpec(copies=run.copies)).events
            events = events if pctx.valid(events) is not None else None
        return None if events is None else self.keep(events)


def bisect(ctx: Context, attempt: Attempt, first_schedule: FirstSchedule) -> str:
    """Raise an unmet budget (``ctx.schedule``: the attempt's answer, proven infeasible below the floor) to the smallest
    feasible budget found, and run ``attempt`` there from the bisection's schedule: ``ctx.schedule`` becomes that
    run's answer, recording the requested budget, what is known about it and where a schedule is known to exist."""
    s, run, t = ctx.settings, ctx.run, ctx.time
    # the call's limit, not a shortened one; the problem in program order (the attempt found no schedule to reorder by)
    prob, budget, limit = ctx.problem, ctx.budget, ctx.time.full_limit_s
    assert ctx.schedule is not None
    proof = ctx.schedule.extra.get("infeasibility_proof")
    t0 = time.perf_counter()
    left = limit - t.elapsed()
    nr_events = baselines.no_recompute_events(prob)
    # deterministic: the time charged for the first attempt (at most its limit) is its share; the probes get a share
    # of the rest as an allowance their work is charged to (each CP-SAT probe: its limit), so the probes and the final
    # run's limit are the same on any machine; the wall clock is only a safety net
    charged = 0.0 if ctx.below_floor else s.no_heuristic_share * limit
    share = s.bisect_share * max(0.0, limit - charged if run.deterministic else left)
    probes = _Probes(ctx, dl.Allowance(share), first_schedule)
    hi = nr_peak = probes.keep(nr_events)
    deadline = min(t0 + (s.wall_safety if run.deterministic else 1.0) * share, dl.current().end)
    scratch = scratch_bound(prob)
    with dl.scope(dl.Deadline(deadline)):  # a probe's greedy runs stop there too
        # one plan raising its budget where it is stuck: the bisection's upper end, near where plans start to fit
        # (first: where the run from scratch takes the allowance and fails, it is left with nothing)
        meter = [0]
        start = max(budget, prob.floor_bytes)
        events = raised_plan(prob, start, int(s.raise_step * start), nr_peak - 1,
                             effort=Effort(meter=meter, work_cap=probes.allowance.units(s.probe_dtr_per_second)))
        probes.allowance.charge(meter[0], s.probe_dtr_per_second)
        if events is not None:
            hi = probes.keep(events)
        if scratch is not None and start <= scratch.bytes < hi:
            # the budget known to be feasible first, where recomputing from scratch gets there in the allowance
            events = fast.from_scratch(probes.at(scratch.bytes)).events
            if events is not None:
                hi = probes.keep(events)
        found = min_feasible_budget(probes.probe, max(budget, prob.floor_bytes - 1), hi, s, deadline=deadline,
                                    spent=probes.allowance.spent)
    bisect_s = time.perf_counter() - t0
    wall_s = max(s.min_limit_s, limit - t.elapsed())
    work_s = share - probes.allowance.seconds
    final_s = max(s.min_limit_s, limit - charged - work_s) if run.deterministic else wall_s
    at = max(found, budget)  # the requested budget where a probe met it (a first attempt out of time): not raised
    final = Context.create(prob.with_budget(at), dl.TimeBudget(final_s, run.deterministic, min(final_s, wall_s)), run,
                           FastOptions.attempt(final_s, s), start=probes.found[found])  # valid there: never without one
    new = attempt(final)
    new.solve_seconds = t.elapsed()
    new.extra.update({"bisection_seconds": round(bisect_s, 3), "bisection_mip_probes": probes.mip_probes,
                      "bisection_work_seconds": round(work_s, 3),
                      "first_feasible_seconds": probes.found_at[found]})  # from the call's start, like the first's
    ctx.final_run = final.trace
    ctx.schedule = new if at == budget else _raised(ctx, new, found, proof)
    outcome = "the requested budget met" if at == budget else f"raised to {found} B"
    return f"{outcome} ({probes.mip_probes} CP-SAT probe(s)); then the strategies above at {at} B (final_run)"


def _raised(ctx: Context, new: Schedule, found: int, proof: str | None) -> Schedule:
    """``new``, at the raised budget ``found``, saying what is known about the requested one (not the raised one the
    schedule meets) and where a schedule is known to exist."""
    prob, budget = ctx.problem, ctx.budget
    known = f"proven infeasible ({proof})" if proof else "not met by any schedule found within the time limit"
    new.extra.update({"requested_budget_bytes": budget,
                      "note": f"requested budget {budget} B is {known}; smallest feasible budget found "
                              f"by bisection (tolerance {ctx.settings.bisect_tolerance:.1%}): {found} B"})
    if not new.ok:
        new.extra["note"] = f"requested budget {budget} B is {known}, and no schedule was found at {found} B either"
    scratch = scratch_bound(prob)
    if scratch is not None and not proof:  # where a schedule is known to exist, though maybe not one to run
        new.extra["scratch_bound"] = {"bytes": scratch.bytes, **{k: v if math.isfinite(v) else None for k, v in (
            ("computes", scratch.computes), ("time_s", scratch.time_s))}}  # beyond a float on very deep graphs
        slower = f", {scratch.time_s / prob.compute_time:.3g}x the compute time" if prob.compute_time > 0 else ""
        new.extra["note"] += (f"; a recompute-only schedule exists at {scratch.bytes} B (recomputing from scratch: "
                              f"{scratch.computes:.3g} computes{slower})")
    return set_budget_status(new, "proven_infeasible" if proof else "not_found", proof)
