"""Portfolio entry point: heuristics give a first schedule at once, CP-SAT improves and bounds it."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from trainplan.schedule import baselines
from trainplan.schedule import deadline as dl
from trainplan.schedule.bounds import RELAXATION_PROOF, Bound, floor_proof, relaxation_bound, trivial_bound
from trainplan.schedule.chain_dp import chain_dp_events
from trainplan.schedule.checkmate import checkmate
from trainplan.schedule.dtr import dtr_plan, raised_plan
from trainplan.schedule.heuristic import INF, POLICIES, Simulator, guided
from trainplan.schedule.last_compute import search as last_compute_search
from trainplan.schedule.mip import (HINT_MAX_GROWTH, WALL_SAFETY, MipResult, SearchStop, hint_growth, objective_ticks,
                                    solve_mip)
from trainplan.schedule.problem import Problem
from trainplan.schedule.replay import ScheduleError, replay
from trainplan.schedule.retain import retain_recomputes
from trainplan.schedule.schedule_io import Schedule, from_events, no_schedule, set_budget_status
from trainplan.schedule.scratch import scratch_bound, scratch_events
from trainplan.schedule.staged_bound import solve_staged, staged_variables
from trainplan.schedule.staged_events import staged_events

log = logging.getLogger(__name__)
Events = list[tuple[str, str]]
METHODS = ("ours", "no_recompute", "sqrt_checkpoint", "checkmate", "swap_only")
BISECT_TOLERANCE = 0.005
RAISE_STEP = 0.001  # the raised plan's least raise, as a share of the budget it starts from (a fifth of the
# bisection's tolerance)
BISECT_SPLIT = 0.75  # the bisection's first probe sits this far up from the floor to the plain peak, not halfway:
# a failed probe is the slow one (1-10 s for the DTR-style plan on 1000-2000-op recompute-only layered DAGs, 0.05-3 s
# where it succeeds), and a first probe at the midpoint spent the whole share failing there, keeping the plain peak
PROBE_GREEDY_WORK_PER_OP = 200  # work cap of a probe's greedy run per op (heuristic.Simulator): runs that met a
# budget used at most 125 per op on layered and training graphs of 250-2000 ops; failing ones 300-800, in 0.5-10 s
PROBE_GREEDY_PER_SECOND = 190_000  # the bisection's allowance charges a greedy run's work units at this rate and the
PROBE_DTR_PER_SECOND = 4_500_000  # DTR-style plan's at this one: this host's (150-230k and 4.2-6.3M per second on
# 250-2000-op layered DAGs); its wall-clock safety net is WALL_SAFETY x its share
HEURISTIC_SHARE = 0.3  # no new greedy variant starts after this share of the time limit (once one is valid)
MIP_MIN_SHARE = 0.2  # CP-SAT runs only if this share of the time limit is left (or nothing else was found)
NO_HEURISTIC_SHARE = 0.5  # with bisection on: the share of the limit the requested budget gets when no greedy fits
# (the rest goes to the bisection); at 0.35 of 10 s the 2000-op layered DAGs at 70% (recompute only) lost their
# first plan, ready at 2.7-3.4 s (1e7-addition loop 0.9-1.2 s), to the raised budget of the bisection
BISECT_SHARE = 0.5  # share of what is left after a failed first attempt that the bisection probes may use
RESTRICTED_SHARE = 0.25  # CP-SAT restricted to the relaxation's remat ops: at most this share of the limit,
RESTRICTED_MAX_S = 3.0  # and at most this many seconds of it: where it works it ends in 0.03-2.3 s; on 250-1000-op
# layered DAGs at 80% it found nothing in 15 s of a 60 s limit, time that window LNS turns into 2-5 points
STAGED_SHARE = 0.3  # the staged bound (small problems), with one worker: at most this share of the limit (deterministic
# with 2+ workers it runs beside CP-SAT, and both get all that is left)
STAGED_VARIABLES_PER_SECOND = 2000  # the staged bound runs if its model has at most this many variables per
# second of the limit (10 s: ~110 ops of a training graph); beyond, its bound rarely passes the relaxation's
SCRATCH_WORK_PER_SECOND = 800_000  # recomputing from scratch: work units per second (scratch._Run; 0.83-1.17M here on
# 100-2000-op layered DAGs on a slow day): its cap is this x the heuristics' share of the limit, or the allowance
SEARCH_WORK_PER_SECOND = 800_000  # the last-compute search (schedule/last_compute.py): work units (members of the
# sets it makes) per second charged (1.1-2.1M here on 100-2000-op layered DAGs on a fast day, where sets per second
# ranged 9-54k); its cap is this x the heuristics' share of the limit, or in a bisection's probe
PROBE_SEARCH_SHARE = 0.2  # this share of the allowance left: on the 100-250-op layered DAGs at 1.1x the memory floor
# it found a schedule in 0.4-1.9M units, and on 500-2000 ops none in 3M (there a probe's search only spends what the
# DTR-style probes need: with all of the allowance, the 2000-op seeds 8 and 14 at 70% were raised to the plain peak)
DTR_OPS_PER_SECOND = 2000  # one DTR-style plan takes about n / this seconds here (under load): restarts are
DTR_MAX_RESTARTS = 8  # min(this, heuristic share x this rate / n), a function of the limit and the size only
REFINE_SHARE = 0.5  # ruin and recreate on the DTR-style plan: this share of the heuristics' time x
REFINE_WORK_PER_SECOND = 3_000_000  # this many work units (dtr._Plan.work; 4.5M per second here on 100-2000-op
# layered DAGs): the same work on any machine; its wall-clock safety net is WALL_SAFETY x that share from the
# refinement's start (from the heuristics' start, it cut the refinement of plans that took longer than the share
# to make: on the 2000-op seed 1 layered DAG at 80%, 60 s, the DTR-style plan came at 10 s and got none)
REFINE_LARGE_EDGES = 4000  # on graphs with more input edges than this (layered DAGs: ~2.6 per op), ruin and recreate
REFINE_LARGE_SHARE = 2.0  # gets this share instead: on the 2000-op layered DAGs (5.1-5.3k edges) at 80%, window LNS
# gained 0-0.3 points in 22 s of a 60 s limit, ruin and recreate 0.4-0.7 points more with 100M units than with 27M
# (where it converges, it stops earlier: 42M and 66M units on the 500- and 1000-op seed 1 graphs)
GUIDED_SHARE = 0.2  # the relaxation-guided greedy run is abandoned after this share of the limit, or after
GUIDED_MAX_S = 2.0  # this many seconds: it ends in 0.04 s on 1000-op training graphs, and on 500-op layered DAGs
# found nothing in 12 s of a 60 s limit (never better than the best fast schedule there or at 100-1000 ops)
GROW_MIN_S = 1.0  # CP-SAT optimal within its grid runs again on a larger grid if this many seconds are left
MIN_STEP_S = 0.05  # a step (relaxation, CP-SAT run) starts only with at least this much wall time left
PROBE_SHARE = 0.05  # CP-SAT budget of one bisection probe (greedy found nothing), as a share of the limit
MAX_MIP_PROBES = 4  # at most this many bisection probes fall back to CP-SAT (a fixed count: deterministic)
DEADLINE_SHARE = 0.9  # every step of a call stops by this share of its time limit; the rest covers the final
# replay, writing the schedule and CP-SAT's stop latency (see docs/schedule.md, "Time limit")
COMPARE_BASELINE_SHARE = 0.5  # compare(): the baselines share this part of the limit, ours gets the rest
LNS_SHARE = 0.5  # a hinted last CP-SAT run gives this share of its time to window LNS (solve_mip's lns_share)
HINT_MAX_OVER_BOUND = 2.0  # CP-SAT gets the incumbent as a hint only if it takes at most this many times the
# lower bound (and its grid grows at most mip.HINT_MAX_GROWTH times): from a +244% greedy schedule of the 100-op
# layered DAG at 80% CP-SAT kept +204% in 60 s, from scratch it found +6%. Otherwise CP-SAT starts on the
# default grid, without the hint, which stays the incumbent
GREEDY_VARIANTS = {"swap+recompute": (True, True), "recompute": (False, True), "swap": (True, False)}


def _valid(problem: Problem, events: Events | None, budget: int) -> float | None:
    """Replayed time of ``events`` if they are valid within ``budget``, else None."""
    if events is None:
        return None
    try:
        return replay(problem, events, budget).time
    except ScheduleError as exc:
        log.warning("discarding an invalid schedule: %s", exc)
        return None


def _from_scratch(problem: Problem, budget: int, work_cap: float, stop: dl.Deadline,
                  allowance: dl.Allowance | None = None) -> tuple[Events | None, float | None]:
    """The polished run recomputing from scratch (scratch.scratch_events) and its time, if it is valid within
    ``budget`` and done within ``work_cap`` units of work (and the ``allowance``, charged: a bisection probe's).
    Tried where its uncached run's computes fit that cap, or, outside a probe, where the budget is at least
    its bound: there it meets the budget given the work, and the slack as a cache makes it far cheaper (on
    the 500-op layered DAGs at 70% of the plain peak, 1.3-3.3M units against 1.2-1.5e8 computes uncached).
    A probe that ran out of work would spend what the other probes need."""
    cap = work_cap if allowance is None else min(work_cap, allowance.units(SCRATCH_WORK_PER_SECOND))
    bound = scratch_bound(problem)  # one pass over the edges: 16 ms on a 2000-op layered DAG
    if bound is None or (bound.computes > cap and (allowance is not None or budget < bound.bytes)):
        return None, None
    meter = [0]
    events = scratch_events(problem, budget, work_cap=cap, stop=stop, meter=meter, bound=bound)
    if allowance is not None:
        allowance.charge(meter[0], SCRATCH_WORK_PER_SECOND)
    return _polish(problem, events, budget)


def _last_compute(problem: Problem, budget: int, max_work: float, stop: dl.Deadline,
                  allowance: dl.Allowance | None) -> tuple[Events | None, float | None, str | None]:
    """The polished schedule of the last-compute search within ``max_work`` units (and PROBE_SEARCH_SHARE of the
    ``allowance``, charged: a bisection probe's), its time, and where no op can be swapped and the search ended
    without one, the proof that no schedule fits."""
    cap = max_work if allowance is None else min(max_work,
                                                 PROBE_SEARCH_SHARE * allowance.units(SEARCH_WORK_PER_SECOND))
    if cap < 1:
        return None, None, None
    found = last_compute_search(problem, budget, max_work=int(min(cap, 2**62)), stop=stop)
    if allowance is not None:
        allowance.charge(found.work, SEARCH_WORK_PER_SECOND)
    if found.status == "infeasible" and not any(op.swap for op in problem.ops):
        return None, None, (f"last-compute search: no recompute-only schedule fits, first computes in any order "
                            f"(the search ended after {found.states} sets)")
    return (*_polish(problem, found.events, budget), None)


def _polish(problem: Problem, events: Events | None, budget: int) -> tuple[Events | None, float | None]:
    """``events`` with each recompute that fits replaced by keeping the tensor (:func:`retain_recomputes`), and
    their replayed time; (None, None) if ``events`` are not valid within ``budget``."""
    if _valid(problem, events, budget) is None:
        return None, None
    events = retain_recomputes(problem, events, budget, dl.current())
    return events, _valid(problem, events, budget)


def cp_hint(problem: Problem, events: Events | None, bound_s: float, copies: int | None = None) -> Events | None:
    """``events`` as a CP-SAT hint; None where they take more than HINT_MAX_OVER_BOUND times the lower bound
    ``bound_s``, or fitting them would grow the model more than HINT_MAX_GROWTH times
    (:func:`mip.hint_growth`)."""
    if events is None or replay(problem, events).time > HINT_MAX_OVER_BOUND * bound_s:
        return None
    return events if hint_growth(problem, events, copies) <= HINT_MAX_GROWTH else None


def greedy_variants(problem: Problem) -> list[tuple[str, bool, bool, str]]:
    """(label, allow_swap, allow_recompute, policy) of the greedy runs that differ on ``problem``: a variant whose
    options this problem's flags make equal to an earlier one's (swap+recompute where no op can be swapped) runs
    once. The swap-only runs come first, one per policy: they take milliseconds, and where every op can be swapped
    they meet any budget at or above the memory floor (the swap_only baseline is the best of them, so ours is never
    worse than it)."""
    can_swap, can_rc = any(op.swap for op in problem.ops), any(op.recompute for op in problem.ops)
    # Belady first, then every policy: on layered DAGs with swap at 1.1x the memory floor (500-2000 ops) each
    # swap-only run took 0.03-0.21 s (median of 3, alone), and the cost policy was the better one on two of three,
    # which the 10 s limit's heuristic share did not reach when it ran last (ours 213.28% against the swap_only
    # baseline's 212.46% at 500 ops, 240.68% against 238.88% at 2000)
    swap_first = [("swap", True, False, policy) for policy in ("belady", *POLICIES)]
    runs = swap_first + [(label, s, r, policy) for label, (s, r) in GREEDY_VARIANTS.items() for policy in POLICIES]
    seen: set[tuple[bool, bool, str]] = set()
    kept = []
    for label, allow_swap, allow_rc, policy in runs:
        swaps, recomputes = allow_swap and can_swap, allow_rc and can_rc
        key = (swaps, recomputes, policy if swaps or recomputes else "")  # no eviction: the policy is moot
        if key not in seen:
            seen.add(key)
            kept.append((label, allow_swap, allow_rc, policy))
    return kept


def refine_share(problem: Problem) -> float:
    """Ruin and recreate's work, as a share of the heuristics' time (see REFINE_LARGE_EDGES)."""
    return REFINE_LARGE_SHARE if sum(map(len, problem.inputs)) > REFINE_LARGE_EDGES else REFINE_SHARE


def best_heuristic(problem: Problem, budget: int, *, first_only: bool = False, deadline_s: float | None = None,
                   first_deadline_s: float | None = None, chain_dp: bool = True, greedy_work: int | None = None,
                   allowance: dl.Allowance | None = None,
                   proofs: list[str] | None = None) -> tuple[Events | None, str, float | None]:
    """Best valid fast schedule (the chain DP on adjoint chains unless ``chain_dp`` is false, the DTR-style
    plan with and without swaps; where none of these fits, the run recomputing from scratch within its work
    cap (see :func:`_from_scratch`); greedy policies x swap/recompute options, sqrt(n) checkpointing), its name,
    and the seconds until the first valid one (``first_only``: stop there, and make only the DTR-style plans that
    hold no input past its last reader, which fail sooner where no plan exists: a bisection probe;
    once one is valid, the greedy runs stop at ``deadline_s``: a running variant is abandoned, none starts;
    before, at ``first_deadline_s``; always at the call's deadline).
    ``greedy_work``: each greedy run's work cap (see ``heuristic.Simulator``). ``allowance``: the work of the
    DTR-style plans, the run from scratch and the greedy runs is charged to it, and no run goes past it
    (deterministic, unlike the deadlines). Where none of the fast schedules fits, the last-compute search
    (:mod:`trainplan.schedule.last_compute`) looks for a recompute-only schedule in any order of first computes;
    where it proves that none exists and no op can be swapped, its proof is appended to ``proofs`` and nothing
    more is tried."""
    t0 = time.perf_counter()
    stop_at = None if deadline_s is None else t0 + deadline_s
    call = dl.current()  # the call's deadline ends every run, even before a first valid schedule
    first_stop = call.earlier(None if first_deadline_s is None else t0 + first_deadline_s)
    best: tuple[float, Events, str] | None = None
    first = None
    variants = greedy_variants(problem)
    can_swap = any(op.swap for op in problem.ops)

    def run_greedy(label: str, allow_swap: bool, allow_rc: bool, policy: str) -> bool:
        """One greedy run, kept if it is the best so far; True if it was. Once one is valid, a swap-only run stops
        only at the call's deadline, as the swap_only baseline does (so ours is never worse than it)."""
        nonlocal best, first
        cap = greedy_work if allowance is None else min(greedy_work or INF, allowance.units(PROBE_GREEDY_PER_SECOND))
        end = call.end if label == "swap" else min(call.end, stop_at or call.end)
        sim = Simulator(problem, budget, allow_swap=allow_swap, allow_recompute=allow_rc, policy=policy,
                        stop_at=first_stop.end if best is None else end,
                        time_cap=None if best is None else best[0],  # a run slower than the best stops
                        work_cap=cap)
        events = sim.run()
        if allowance is not None:
            allowance.charge(sim.work_done, PROBE_GREEDY_PER_SECOND)
        events, t = _polish(problem, events, budget)
        if t is None or (best is not None and t >= best[0]):
            return False
        best = (t, events, f"greedy-{policy}-{label}")
        first = time.perf_counter() - t0 if first is None else first
        return True

    chain_events, chain_time = _polish(problem, chain_dp_events(problem, budget) if chain_dp else None, budget)
    if chain_events is not None and chain_time is not None:
        best, first = (chain_time, chain_events, "chain-dp"), time.perf_counter() - t0
        if first_only:
            return best[1], best[2], first
    while can_swap and variants and variants[0][0] == "swap":  # the swap-only runs: a first schedule in milliseconds
        if run_greedy(*variants.pop(0)) and first_only:
            return best[1], best[2], first
    for allow_swap in (True, False):  # the DTR-style plan: fast, and good on wide graphs
        restarts = 0 if deadline_s is None else min(DTR_MAX_RESTARTS, int(deadline_s * DTR_OPS_PER_SECOND / problem.n))
        share = refine_share(problem)
        refine = 0 if deadline_s is None else int(share * deadline_s * REFINE_WORK_PER_SECOND)
        stop = first_stop if best is None else call
        meter, found = [0], []
        events = dtr_plan(problem, budget, allow_swap=allow_swap, restarts=restarts, refine=refine, stop=stop,
                          refine_wall_s=None if deadline_s is None else WALL_SAFETY * share * deadline_s,
                          meter=meter, work_cap=INF if allowance is None else allowance.units(PROBE_DTR_PER_SECOND),
                          found=found, holds=not first_only)
        if allowance is not None:
            allowance.charge(meter[0], PROBE_DTR_PER_SECOND)
        t = _valid(problem, events, budget)  # the plan's events are polished already
        if t is not None and (best is None or t < best[0]):
            best = (t, events, "dtr-plan" if allow_swap else "dtr-plan-recompute")
            first = found[0] - t0 if first is None else first  # the plan was valid before its refinement
            if first_only:
                return best[1], best[2], first
        if not can_swap:
            break  # both runs would be the same
    if best is None:  # recomputing from scratch: slow schedules, but they fit budgets where nothing above does
        events, t = _from_scratch(problem, budget, INF if deadline_s is None else deadline_s * SCRATCH_WORK_PER_SECOND,
                                  first_stop, allowance)  # a failed run would take the bisection's time
        if t is not None:
            best, first = (t, events, "scratch-recompute"), time.perf_counter() - t0
            if first_only:
                return best[1], best[2], first
    if best is None:  # an exact search in any order: it finds schedules near the floor, or proves there are none
        events, t, proof = _last_compute(problem, budget,
                                         INF if deadline_s is None else deadline_s * SEARCH_WORK_PER_SECOND,
                                         first_stop, allowance)
        if proof is not None:  # no schedule fits: the runs below cannot find one
            if proofs is not None:
                proofs.append(proof)
            return None, "", None
        if t is not None:
            best, first = (t, events, "last-compute-search"), time.perf_counter() - t0
            if first_only:
                return best[1], best[2], first
    for variant in variants:
        if run_greedy(*variant) and first_only:
            return best[1], best[2], first
        if (best is not None and deadline_s is not None and time.perf_counter() - t0 > deadline_s) \
                or (first_stop if best is None else call).passed():
            return (None, "", None) if best is None else (best[1], best[2], first)
    sqrt_events = None if call.passed() else baselines.sqrt_checkpoint_events(problem)
    if sqrt_events is not None and replay(problem, sqrt_events).peak_bytes <= budget:  # often over: skipped
        sqrt_events, sqrt_time = _polish(problem, sqrt_events, budget)
        if sqrt_time is not None and (best is None or sqrt_time < best[0]):
            best = (sqrt_time, sqrt_events, "sqrt_checkpoint")
            first = time.perf_counter() - t0 if first is None else first
    return (None, "", None) if best is None else (best[1], best[2], first)


@dataclass
class _Clock:
    """The time limit of one call. ``left()`` is what the next step may use: the wall-clock time left, or in a
    deterministic run the limit less what the CP-SAT steps used on their deterministic clocks (``charge``),
    so every step's share, and with it the answer, is the same on any machine; ``wall_left()`` caps each
    step (a safety net)."""

    limit_s: float
    deterministic: bool
    wall_limit_s: float  # limit_s, or less in a bisection's final run (the probes' wall time is not charged)
    t0: float = field(default_factory=time.perf_counter)
    used_s: float = 0.0

    def charge(self, seconds: float) -> None:
        self.used_s += seconds

    def wall_left(self) -> float:
        """Wall time left to this step: its own wall limit, or the call's deadline if that comes first."""
        return min(self.wall_limit_s - (time.perf_counter() - self.t0), dl.current().left())

    def left(self) -> float:
        return self.limit_s - self.used_s if self.deterministic else self.wall_left()


@dataclass
class _Incumbent:
    """The best replay-valid schedule so far: events, origin, replayed time, seconds to the first valid one."""

    events: Events | None
    name: str
    time: float | None
    first: float | None

    def offer(self, events: Events | None, time_s: float | None, name: str, t0: float) -> None:
        """Take ``events`` (replayed time ``time_s``, None if invalid) if they are faster."""
        if time_s is not None and (self.time is None or time_s < self.time):
            self.events, self.name, self.time = events, name, time_s
            self.first = time.perf_counter() - t0 if self.first is None else self.first


def _ours_at(problem: Problem, budget: int, time_limit_s: float, workers: int, seed: int,
             deterministic: bool, copies: int | None, verbose: bool,
             limit_if_no_heuristic_s: float | None = None, wall_limit_s: float | None = None,
             start: Events | None = None) -> Schedule:
    """Greedy schedules, then the relaxation bound, its guided schedule and CP-SAT restricted to the ops it
    rematerialises, the staged bound, then full CP-SAT from the best hint; the answer is the best
    replay-valid schedule with the best proven bound.
    ``limit_if_no_heuristic_s``: the (shorter) limit to use when no greedy schedule fits, so a
    budget that is probably infeasible leaves time for the bisection. ``wall_limit_s``: a wall-clock limit
    below ``time_limit_s`` (see ``_Clock``). ``start``: a valid schedule to improve (a bisection's probe's)."""
    clock = _Clock(time_limit_s, deterministic, time_limit_s if wall_limit_s is None else wall_limit_s)
    t0 = clock.t0
    proofs: list[str] = []
    events, name, first = best_heuristic(problem, budget, deadline_s=HEURISTIC_SHARE * time_limit_s,
                                         first_deadline_s=limit_if_no_heuristic_s, proofs=proofs)
    if proofs:
        return _proven_infeasible(problem, budget, proofs[0], t0, {"heuristic": None, "first_feasible_seconds": None})
    full = (clock.limit_s, clock.wall_limit_s)  # restored if the shortened attempt finds a schedule
    if events is None and limit_if_no_heuristic_s is not None:
        time_limit_s = clock.limit_s = min(time_limit_s, limit_if_no_heuristic_s)
        clock.wall_limit_s = min(clock.wall_limit_s, limit_if_no_heuristic_s)
    inc = _Incumbent(events, name, _valid(problem, events, budget), first)
    if start is not None:
        inc.offer(*_polish(problem, start, budget), "bisection-probe", t0)
    problem, reordered = _in_first_compute_order(problem, inc.events)
    order_from = inc.name if reordered else None
    relax_s = max(0.1, min(time_limit_s / 2, clock.left()))
    if clock.wall_left() > MIN_STEP_S:
        relax = relaxation_bound(problem, budget, time_limit_s=relax_s, workers=workers, seed=seed,
                                 deterministic=deterministic, wall_cap_s=clock.wall_left())
    else:
        relax = trivial_bound(problem, "NOT_RUN")
    clock.charge(relax.work_s)
    # abandoned at the time limit: on long recompute chains one greedy run can take longer than the limit
    guided_stop = min(t0 + time_limit_s, time.perf_counter() + min(GUIDED_SHARE * time_limit_s, GUIDED_MAX_S))
    guided_events = guided(problem, budget, relax.evict, stop_at=guided_stop) if relax.evict else None
    inc.offer(*_polish(problem, guided_events, budget), "relaxation-guided", t0)
    extra: dict[str, Any] = {"relaxation": {"bound": relax.seconds, "status": relax.status},
                             "time_no_recompute": problem.compute_time}
    if order_from:  # the bounds below hold over schedules whose first computes come in this order
        extra["program_order"] = f"the first computes of the {order_from} schedule"
    if relax.infeasible:
        extra.update(heuristic=inc.name or None, heuristic_time=inc.time, first_feasible_seconds=None)
        return _proven_infeasible(problem, budget, RELAXATION_PROOF, t0, extra)
    share = min(RESTRICTED_SHARE * time_limit_s, RESTRICTED_MAX_S, clock.left())
    if relax.evict and min(share, clock.wall_left()) > MIN_STEP_S and (
            inc.events is None or objective_ticks(problem, inc.events) > relax.ticks):
        r_events, extra["restricted_mip"], work = _restricted_mip(problem, budget, relax, share, workers, seed,
                                                                  deterministic, clock.wall_left())
        clock.charge(work)
        inc.offer(*_polish(problem, r_events, budget), "relaxation-restricted-mip", t0)
    extra.update(heuristic=inc.name or None, heuristic_time=inc.time)
    best, res = relax, None
    if inc.events is not None and objective_ticks(problem, inc.events) > relax.ticks:
        best, res = _staged_phase(problem, budget, relax, inc, clock, workers, seed, copies, verbose, extra)
    remaining = clock.left()
    # a schedule at the bound in objective ticks is optimal among all schedules (first computes in program order)
    proven = inc.events is not None and objective_ticks(problem, inc.events) <= best.ticks
    if res is None and proven:  # CP-SAT cannot improve it
        res = MipResult(None, "SKIPPED", None, None, 0.0, None, {"note": "schedule meets the lower bound"})
    elif res is None and ((inc.events is not None and remaining < MIP_MIN_SHARE * time_limit_s)
                          or clock.wall_left() <= MIN_STEP_S):
        # heuristics and relaxation used the time; building a big model would overrun the limit
        res = MipResult(None, "SKIPPED", None, None, 0.0, None,
                        {"note": f"{min(remaining, clock.wall_left()):.1f} s left"})
    elif res is None:  # after the staged model (or instead of it), from the best schedule and bound
        res = solve_mip(problem, budget, time_limit_s=max(0.1, remaining), workers=workers, seed=seed,
                        hint=cp_hint(problem, inc.events, best.seconds, copies), copies=copies,
                        lower_bound_ticks=best.ticks,
                        deterministic=deterministic, verbose=verbose, wall_cap_s=clock.wall_left(),
                        lns_share=LNS_SHARE)
        res = _grow_grid(problem, budget, res, best.ticks, max(0.1, remaining), clock.wall_left(), workers, seed,
                         deterministic, verbose)
        clock.charge(res.work_s)
    shortened = (clock.limit_s, clock.wall_limit_s) != full
    found = _valid(problem, res.events, budget) if shortened and not proven else None
    if found is not None:
        res = _improve(problem, budget, res, found, best, clock, full, workers, seed, copies, verbose, extra)
    sched = _answer(problem, budget, inc, best, proven, res, t0, extra)
    return set_budget_status(sched, "met" if sched.ok else "not_found")


def _proven_infeasible(problem: Problem, budget: int, proof: str, t0: float, extra: dict[str, Any]) -> Schedule:
    """No schedule, the budget proven infeasible: by the single-op floor where that suffices, else by ``proof``."""
    proof = floor_proof(problem, budget) or proof
    return set_budget_status(no_schedule(budget, "ours", time.perf_counter() - t0, f"proven infeasible ({proof})",
                                         extra), "proven_infeasible", proof)


def _in_first_compute_order(problem: Problem, events: Events | None) -> tuple[Problem, bool]:
    """``problem`` with its ops in the order of their first computes in ``events`` (the last-compute search's
    come in any order; every later step follows the program order), and whether that changed the order."""
    if events is None:
        return problem, False
    order = list(dict.fromkeys(oid for kind, oid in events if kind == "compute"))
    if order == [op.id for op in problem.ops]:
        return problem, False
    return problem.in_order(order), True


def _grow_grid(problem: Problem, budget: int, res: MipResult, bound_ticks: int, time_s: float, wall_s: float,
               workers: int, seed: int, deterministic: bool, verbose: bool,
               stop: SearchStop | None = None) -> MipResult:
    """While CP-SAT proves its schedule optimal only within its grid (C copies per op, K remat slots per block:
    a good hint sizes the grid to itself) above the lower bound ``bound_ticks``, and at least GROW_MIN_S of
    ``time_s`` (wall: ``wall_s``) is left: once more on a grid one copy and one slot larger, hinted with that
    schedule; until a larger grid gains nothing. The last result that is no worse, its ``work_s`` covering
    every run (``stats["grown"]`` lists the larger grids' runs)."""
    t0, used, runs = time.perf_counter(), res.work_s, []
    ticks = None if res.events is None else objective_ticks(problem, res.events)
    while (res.status == "OPTIMAL" and ticks is not None and ticks > bound_ticks
           and min(time_s - used, wall_s - (time.perf_counter() - t0)) >= GROW_MIN_S
           and not (stop is not None and stop.requested)):
        copies, slots = res.stats["copies"] + 1, res.stats["slots"] + 1
        more = solve_mip(problem, budget, time_limit_s=time_s - used, workers=workers, seed=seed, hint=res.events,
                         copies=copies, slots=slots, lower_bound_ticks=bound_ticks, deterministic=deterministic,
                         verbose=verbose, wall_cap_s=wall_s - (time.perf_counter() - t0), stop=stop,
                         lns_share=LNS_SHARE)
        used += more.work_s
        runs.append({"copies": copies, "slots": slots, "status": more.status, "objective": more.objective_s,
                     "wall_seconds": round(more.wall_s, 3)})
        more_ticks = None if _valid(problem, more.events, budget) is None else objective_ticks(problem, more.events)
        if more_ticks is None or more_ticks > ticks:
            break
        res, gained, ticks = more, more_ticks < ticks, more_ticks
        if not gained:  # the larger grid holds nothing better: a still larger one rarely does
            break
    if not runs:
        return res
    return replace(res, work_s=used, stats={**res.stats, "grown": runs})


def _improve(problem: Problem, budget: int, res: MipResult, res_time: float, best: Bound, clock: _Clock,
             full: tuple[float, float], workers: int, seed: int, copies: int | None, verbose: bool,
             extra: dict[str, Any]) -> MipResult:
    """After an attempt shortened because no greedy schedule fit (the budget looked infeasible), CP-SAT
    found one (replayed time ``res_time``): the budget is met, so the rest of the full limit goes to
    improving that schedule (CP-SAT from it as a hint, then window LNS). The better of the two results."""
    clock.limit_s, clock.wall_limit_s = full
    left = min(clock.left(), clock.wall_left())
    if left < MIP_MIN_SHARE * clock.limit_s or cp_hint(problem, res.events, best.seconds, copies) is None:
        return res
    more = solve_mip(problem, budget, time_limit_s=left, workers=workers, seed=seed, hint=res.events,
                     copies=copies, lower_bound_ticks=best.ticks, deterministic=clock.deterministic,
                     verbose=verbose, wall_cap_s=clock.wall_left(), lns_share=LNS_SHARE)
    clock.charge(more.work_s)
    extra["improve_mip"] = {"status": more.status, "objective_before": res.objective_s,
                            "objective": more.objective_s, "wall_seconds": round(more.wall_s, 3)}
    after = _valid(problem, more.events, budget)
    return more if after is not None and after < res_time else res


def _staged_phase(problem: Problem, budget: int, relax: Bound, inc: _Incumbent, clock: _Clock, workers: int,
                  seed: int, copies: int | None, verbose: bool,
                  extra: dict[str, Any]) -> tuple[Bound, MipResult | None]:
    """The staged bound (small problems only), and in deterministic runs with 2+ workers CP-SAT beside it from
    the incumbent, stopped if the staged model proves a schedule. The better bound, and CP-SAT's result if it
    ran; the incumbent takes the staged schedule if it is faster."""
    left = clock.left()
    # with 2+ workers a deterministic CP-SAT run from the incumbent goes beside the staged model (one worker
    # each); without a usable hint CP-SAT runs after it, its workers interleaved
    hint = cp_hint(problem, inc.events, relax.seconds, copies)
    beside = workers >= 2 and clock.deterministic and hint is not None
    share = _staged_share(problem, left, clock.limit_s, parallel=beside)
    if share is None:
        return relax, None
    res = None
    stop = SearchStop()
    with ThreadPoolExecutor(1) as pool:
        mip = pool.submit(_mip_grown, problem, budget, share, seed, hint, copies, relax.ticks, clock.deterministic,
                          verbose, stop, clock.wall_left()) if beside else None
        staged, s_events, _ = _staged(problem, budget, share, seed, clock.deterministic,
                                           objective_ticks(problem, inc.events), clock.wall_left(), extra)
        best = staged if staged.ticks > relax.ticks else relax
        inc.offer(*_polish(problem, s_events, budget), "staged-model", clock.t0)
        extra.update(heuristic=inc.name, heuristic_time=inc.time)
        if mip is not None:
            if objective_ticks(problem, inc.events) <= best.ticks:  # proven: CP-SAT's answer is not used
                stop.stop()
            res = mip.result()
    # beside CP-SAT the two ran at once: the longer is charged (CP-SAT is stopped early only by a proof,
    # and then no step follows)
    clock.charge(max(staged.work_s, 0.0 if res is None else res.work_s))
    return best, res


def _mip_grown(problem: Problem, budget: int, time_s: float, seed: int, hint: Events, copies: int | None,
               bound_ticks: int, deterministic: bool, verbose: bool, stop: SearchStop, wall_s: float) -> MipResult:
    """CP-SAT with one worker from ``hint`` for ``time_s``, its grid grown while it ends optimal within it
    (:func:`_grow_grid`); ``stop`` ends it."""
    t0 = time.perf_counter()
    res = solve_mip(problem, budget, time_limit_s=time_s, workers=1, seed=seed, hint=hint, copies=copies,
                    lower_bound_ticks=bound_ticks, deterministic=deterministic, verbose=verbose, stop=stop,
                    wall_cap_s=wall_s, lns_share=LNS_SHARE)
    return _grow_grid(problem, budget, res, bound_ticks, time_s, wall_s - (time.perf_counter() - t0), 1, seed,
                      deterministic, verbose, stop)


def _answer(problem: Problem, budget: int, inc: _Incumbent, best: Bound, proven: bool, res: MipResult, t0: float,
            extra: dict[str, Any]) -> Schedule:
    """The better of CP-SAT's schedule (polished) and the incumbent, with the best valid bound and the extras."""
    mip_events, mip_time = _polish(problem, res.events, budget)
    first = inc.first
    if first is None and res.first_solution_s is not None:
        first = time.perf_counter() - t0 - res.wall_s + res.first_solution_s
    extra["mip"] = {"status": res.status, "objective": res.objective_s, "bound": res.bound_s,
                    "wall_seconds": round(res.wall_s, 3), "replay_time": mip_time, **res.stats}
    extra["first_feasible_seconds"] = first
    # CP-SAT's own bound holds for its model (at most C copies per op, K remat slots per block), not for
    # every schedule; only the relaxation bounds are reported, and only a schedule at them is "optimal".
    # CP-SAT's "optimal" within its model is said in the extra.
    bound = best.seconds
    elapsed = time.perf_counter() - t0
    if not proven and mip_time is not None and (inc.time is None or mip_time <= inc.time):
        at_bound = objective_ticks(problem, mip_events) <= best.ticks  # proven even if CP-SAT did not notice
        if res.status == "OPTIMAL" and not at_bound:
            extra["optimal_within"] = (f"the CP-SAT model: {res.stats.get('copies')} copies per op, "
                                       f"{res.stats.get('slots')} remat slots per block")
        return from_events(problem, mip_events, budget_bytes=budget, method="ours", solve_seconds=elapsed,
                           bound=bound, optimal=at_bound, extra=extra)
    if inc.events is not None:
        return from_events(problem, inc.events, budget_bytes=budget, method="ours", solve_seconds=elapsed,
                           bound=bound, optimal=proven, extra=extra)
    note = ("no schedule found: the CP-SAT model (at most C copies per op, K remat slots per block) is "
            "infeasible; not a proof for the unrestricted problem" if res.status == "INFEASIBLE"
            else "no schedule found within the time limit")
    return no_schedule(budget, "ours", elapsed, note, extra)


def _restricted_mip(problem: Problem, budget: int, relax: Bound, time_limit_s: float, workers: int, seed: int,
                    deterministic: bool, wall_cap_s: float) -> tuple[Events | None, dict[str, Any], float]:
    """CP-SAT where only the ops whose gaps the relaxation evicts may be rematerialised: a model a tenth
    the size of the full one, often solved at the relaxation bound in well under a second (then the
    schedule is proven optimal for the unrestricted problem). If that restriction is infeasible (a
    recompute may need an evicted input back), once more with those ops' inputs added. Its events (if
    replay-valid), a summary and the seconds of the limit it used (see ``_Clock``); ``wall_cap_s``: the wall
    time left to the call."""
    t0 = time.perf_counter()
    ops = frozenset(u for u, _ in relax.evict)
    res = solve_mip(problem, budget, time_limit_s=time_limit_s, workers=workers, seed=seed, remat_ops=ops,
                    lower_bound_ticks=relax.ticks, deterministic=deterministic, wall_cap_s=wall_cap_s)
    used = res.work_s
    if res.status == "INFEASIBLE" and time_limit_s - used > 0.05:
        ops |= {w for u in ops for w in problem.inputs[u]}
        res = solve_mip(problem, budget, time_limit_s=time_limit_s - used, workers=workers, seed=seed,
                        remat_ops=ops, lower_bound_ticks=relax.ticks, deterministic=deterministic,
                        wall_cap_s=wall_cap_s - (time.perf_counter() - t0))
        used += res.work_s
    replay_time = _valid(problem, res.events, budget)
    summary = {"status": res.status, "remat_ops": len(ops), "replay_time": replay_time,
               "at_bound": replay_time is not None and objective_ticks(problem, res.events) <= relax.ticks,
               "wall_seconds": round(time.perf_counter() - t0, 3), "variables": res.stats.get("variables")}
    return (None if replay_time is None else res.events), summary, used


def _staged_share(problem: Problem, left_s: float, time_limit_s: float, parallel: bool) -> float | None:
    """Seconds for the staged model, or None if the problem is too big or too little time is left. Beside
    CP-SAT (``parallel``) it may use all that is left; before it, at most STAGED_SHARE of the limit."""
    if staged_variables(problem) > STAGED_VARIABLES_PER_SECOND * time_limit_s:
        return None
    share = left_s if parallel else min(STAGED_SHARE * time_limit_s, left_s - MIP_MIN_SHARE * time_limit_s)
    return share if share >= 0.05 else None


def _staged(problem: Problem, budget: int, share_s: float, seed: int, deterministic: bool,
            schedule_ticks: int, wall_cap_s: float, extra: dict[str, Any]) -> tuple[Bound, Events | None, float | None]:
    """The staged model for ``share_s`` seconds (summary in ``extra``), stopped once its bound proves the
    schedule of ``schedule_ticks``: its bound, and the events of its last solution with their replayed
    time, if they fit the budget."""
    t0 = time.perf_counter()
    staged, solution = solve_staged(problem, budget, time_limit_s=share_s, seed=seed, deterministic=deterministic,
                                    stop_at_ticks=schedule_ticks, wall_cap_s=wall_cap_s)
    events, replayed = (staged_events(problem, solution), None) if solution is not None else (None, None)
    if events is not None:
        try:
            replayed = replay(problem, events, budget).time
        except ScheduleError:  # memory inside a stage is counted only in part: expected, not a fault
            events = None
    extra["staged_bound"] = {"bound": staged.seconds, "status": staged.status,
                             "variables": staged_variables(problem),
                             "wall_seconds": round(time.perf_counter() - t0, 3), "schedule_time": replayed}
    return staged, events, replayed


def min_feasible_budget(probe: Callable[[int], int | None], lo: int, hi: int, deadline: float | None = None,
                        spent: Callable[[], bool] | None = None) -> int:
    """Smallest budget in (lo, hi] that ``probe`` finds a schedule for (lo fails, hi passes), to
    BISECT_TOLERANCE: the first probe sits BISECT_SPLIT of the way up from lo, the others halfway.
    ``probe(b)`` returns the peak of a schedule within b (so hi drops to that peak at once), or None. Once
    ``spent()`` (the probes' deterministic allowance), or past the ``deadline`` (a perf_counter time; a wall-clock
    safety net): the best so far."""
    split = BISECT_SPLIT
    while hi - lo > max(1, int(BISECT_TOLERANCE * hi)):
        if (deadline is not None and time.perf_counter() > deadline) or (spent is not None and spent()):
            break
        mid = min(hi - 1, lo + max(1, int(split * (hi - lo))))
        peak, split = probe(mid), 0.5
        if peak is None:
            lo = mid
        else:
            hi, lo = peak, min(lo, peak - 1)
    return hi


def solve(problem: Problem, time_limit_s: float = 10.0, workers: int = 2, seed: int = 0, *,
          method: str = "ours", budget_bytes: int | None = None, bisect: bool = True,
          deterministic: bool = True, copies: int | None = None, verbose: bool = False) -> Schedule:
    """Schedule ``problem`` at ``budget_bytes`` (default: the problem's) with one method.

    For "ours", an infeasible budget triggers a bisection from the memory floor to the no-recompute
    peak (probes: greedy, then a short CP-SAT run); the schedule then records ``budget_bytes`` (the
    smallest feasible budget found), ``requested_budget_bytes`` and a note. The whole call, bisection
    included, shares ``time_limit_s``: every step stops by DEADLINE_SHARE of it (see docs/schedule.md,
    "Time limit").
    """
    with dl.scope(dl.Deadline.after(DEADLINE_SHARE * time_limit_s)):
        return _solve(problem, time_limit_s, workers, seed, method, budget_bytes, bisect, deterministic, copies,
                      verbose)


def _solve(problem: Problem, time_limit_s: float, workers: int, seed: int, method: str, budget_bytes: int | None,
           bisect: bool, deterministic: bool, copies: int | None, verbose: bool) -> Schedule:
    t_start = time.perf_counter()
    budget = problem.budget_bytes if budget_bytes is None else budget_bytes
    prob = problem.with_budget(budget)
    if method != "ours":
        return _baseline(prob, method, time_limit_s, workers, seed)
    below_floor = budget < prob.floor_bytes  # no schedule can exist: skip straight to the bisection
    proof = floor_proof(prob, budget)
    if not (bisect and below_floor):
        sched = _ours_at(prob, budget, time_limit_s, workers, seed, deterministic, copies, verbose,
                         limit_if_no_heuristic_s=NO_HEURISTIC_SHARE * time_limit_s if bisect else None)
        if sched.ok or not bisect:
            return sched
        proof = sched.extra.get("infeasibility_proof")
    t0 = time.perf_counter()
    left = time_limit_s - (t0 - t_start)
    nr_events = baselines.no_recompute_events(prob)
    nr_peak = replay(prob, nr_events).peak_bytes
    probe_s = max(0.1, PROBE_SHARE * time_limit_s)
    # deterministic: the time charged for the first attempt (at most its limit) is its share; the probes get a
    # share of the rest as an allowance their work is charged to (each CP-SAT probe: its limit), so the probes
    # and the final run's limit are the same on any machine; the wall clock is only a safety net
    charged = 0.0 if below_floor else NO_HEURISTIC_SHARE * time_limit_s
    share = BISECT_SHARE * max(0.0, time_limit_s - charged if deterministic else left)
    allowance = dl.Allowance(share)
    found_events: dict[int, Events] = {nr_peak: nr_events}
    found_at: dict[int, float] = {nr_peak: time.perf_counter() - t_start}  # seconds from the call's start
    mip_probes = 0

    def probe(b: int) -> int | None:
        nonlocal mip_probes
        # on adjoint chains one DP run holds the cost at every smaller memory: take its least-memory schedule
        events = chain_dp_events(prob, b, least_memory=True)
        if _valid(prob, events, b) is None:
            events = best_heuristic(prob, b, first_only=True, chain_dp=False,
                                    greedy_work=PROBE_GREEDY_WORK_PER_OP * prob.n, allowance=allowance)[0]
        if events is None and mip_probes < MAX_MIP_PROBES and not allowance.spent():
            mip_probes += 1
            allowance.charge(probe_s, 1.0)  # a CP-SAT probe: its limit
            events = solve_mip(prob, b, time_limit_s=probe_s, workers=workers, seed=seed, copies=copies,
                               deterministic=deterministic).events
            events = events if _valid(prob, events, b) is not None else None
        if events is None:
            return None
        peak = replay(prob, events).peak_bytes
        found_events[peak], found_at[peak] = events, time.perf_counter() - t_start
        return peak

    deadline = min(t0 + (WALL_SAFETY if deterministic else 1.0) * share, dl.current().end)
    scratch = scratch_bound(prob)
    hi = nr_peak
    with dl.scope(dl.Deadline(deadline)):  # a probe's greedy runs stop there too
        # one plan raising its budget where it is stuck: the bisection's upper end, near where plans start to fit
        # (first: where the run from scratch takes the allowance and fails, it is left with nothing)
        meter = [0]
        start = max(budget, prob.floor_bytes)
        events = raised_plan(prob, start, int(RAISE_STEP * start), hi - 1, meter=meter,
                             work_cap=allowance.units(PROBE_DTR_PER_SECOND))
        allowance.charge(meter[0], PROBE_DTR_PER_SECOND)
        if events is not None:
            hi = replay(prob, events).peak_bytes
            found_events[hi], found_at[hi] = events, time.perf_counter() - t_start
        if scratch is not None and start <= scratch.bytes < hi:
            # the budget known to be feasible first, where recomputing from scratch gets there in the allowance
            events, _ = _from_scratch(prob, scratch.bytes, INF, dl.current(), allowance)
            if events is not None:
                hi = replay(prob, events).peak_bytes
                found_events[hi], found_at[hi] = events, time.perf_counter() - t_start
        found = min_feasible_budget(probe, max(budget, prob.floor_bytes - 1), hi, deadline=deadline,
                                    spent=allowance.spent)
    bisect_s = time.perf_counter() - t0
    wall_s = max(0.1, time_limit_s - (time.perf_counter() - t_start))
    final_s = max(0.1, time_limit_s - charged - (share - allowance.seconds)) if deterministic else wall_s
    at = max(found, budget)  # the requested budget where a probe met it (a first attempt out of time): not raised
    new = _ours_at(prob.with_budget(at), at, final_s, workers, seed, deterministic, copies, verbose,
                   wall_limit_s=min(final_s, wall_s), start=found_events[found])  # valid there: never without one
    new.solve_seconds = time.perf_counter() - t_start
    new.extra.update({"bisection_seconds": round(bisect_s, 3), "bisection_mip_probes": mip_probes,
                      "bisection_work_seconds": round(share - allowance.seconds, 3),
                      "first_feasible_seconds": found_at[found]})  # from the call's start, like the first attempt's
    if at == budget:
        return new
    known = f"proven infeasible ({proof})" if proof else "not met by any schedule found within the time limit"
    new.extra.update({"requested_budget_bytes": budget,
                      "note": f"requested budget {budget} B is {known}; smallest feasible budget found "
                              f"by bisection (tolerance {BISECT_TOLERANCE:.1%}): {found} B"})
    if not new.ok:
        new.extra["note"] = f"requested budget {budget} B is {known}, and no schedule was found at {found} B either"
    if scratch is not None and not proof:  # where a schedule is known to exist, though maybe not one to run
        new.extra["scratch_bound"] = {"bytes": scratch.bytes, **{k: v if math.isfinite(v) else None for k, v in (
            ("computes", scratch.computes), ("time_s", scratch.time_s))}}  # beyond a float on very deep graphs
        slower = f", {scratch.time_s / prob.compute_time:.3g}x the compute time" if prob.compute_time > 0 else ""
        new.extra["note"] += (f"; a recompute-only schedule exists at {scratch.bytes} B (recomputing from scratch: "
                              f"{scratch.computes:.3g} computes{slower})")
    # what is known about the requested budget (not the raised one the schedule meets)
    return set_budget_status(new, "proven_infeasible" if proof else "not_found", proof)


def _baseline(problem: Problem, method: str, time_limit_s: float, workers: int, seed: int) -> Schedule:
    if method == "no_recompute":
        return baselines.no_recompute(problem)
    if method == "sqrt_checkpoint":
        return baselines.sqrt_checkpoint(problem, time_limit_s)
    if method == "swap_only":
        return baselines.swap_only(problem, time_limit_s)
    if method == "checkmate":  # the MILP where it builds in time, else its LP rounding (checkmate decides)
        return checkmate(problem, time_limit_s=min(time_limit_s, dl.current().left()), workers=workers, seed=seed)
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def compare(problem: Problem, time_limit_s: float = 10.0, workers: int = 2, seed: int = 0,
            **kwargs: Any) -> dict[str, Schedule]:
    """Every method on the same problem and budget (no bisection), keyed by method name, within
    ``time_limit_s`` in all: the baselines share COMPARE_BASELINE_SHARE of it, ours gets the rest (in a
    deterministic run, exactly the rest of the limit, so its answer does not depend on the baselines' speed)."""
    with dl.scope(dl.Deadline.after(DEADLINE_SHARE * time_limit_s)):
        t0 = time.perf_counter()
        base_s = COMPARE_BASELINE_SHARE * time_limit_s
        with dl.scope(dl.Deadline.after(base_s)):
            # the greedy baselines first (each stops at the scope's end): Checkmate's MILP gets what they leave
            order = sorted((m for m in METHODS if m != "ours"), key=lambda m: m == "checkmate")
            out = {m: _baseline(problem, m, base_s, workers, seed) for m in order}
        ours_s = time_limit_s - (base_s if kwargs.get("deterministic", True) else time.perf_counter() - t0)
        ours = solve(problem, max(0.1, ours_s), workers, seed, method="ours", bisect=False, **kwargs)
    return {"ours": ours, **{m: out[m] for m in METHODS if m != "ours"}}
