"""The time limit covers the whole solve (bisection included); the restore-cost cache changes nothing."""

import math
from dataclasses import replace
import threading
import time

import pytest
from ortools.sat.python import cp_model

from trainplan.schedule import deadline as dl
from trainplan.schedule import SolveOptions, bounds, mip, replay, solve, staged_bound
from trainplan.schedule.baselines import no_recompute_events
from trainplan.schedule.chain import adjoint_chain
from trainplan.schedule.heuristic import POLICIES, Limits, Simulator, greedy
from trainplan.schedule.mip import CpSatRun, ModelSpec, model_variables, solve_mip
from trainplan.schedule.replay import replay as independent_replay
from trainplan.schedule import fast, improve, portfolio
from trainplan.schedule.bisection import min_feasible_budget
from trainplan.schedule.context import FastOptions, Polished
from trainplan.schedule.fast import greedy_variants
from trainplan.schedule.portfolio import best_heuristic
from trainplan.schedule.settings import DEFAULTS
from trainplan.schedule.synthetic import layered_graph, training_graph



class _Uncached(Simulator):
    """The plain recursion the cache must reproduce exactly."""

    def restore_cost(self, u: int) -> float:
        if u in self.resident:
            return 0.0
        best = math.inf
        if u in self.host and self.can_swap(u):
            best = self.p.transfer_time(u)
        if self.can_recompute(u):
            best = min(best, self.p.ops[u].time + sum(self.restore_cost(w) for w in self.p.inputs[u]))
        return best


@pytest.mark.parametrize("seed", [0, 4])
def test_restore_cost_cache_gives_identical_schedules(seed):
    p = training_graph(50, seed)
    peak = replay(p, no_recompute_events(p)).peak_bytes
    for frac in (0.8, 0.5, 0.3):
        b = p.fixed_bytes + int((peak - p.fixed_bytes) * frac)
        for swap, rc in ((True, True), (False, True), (True, False)):
            for policy in POLICIES:
                kw = dict(allow_swap=swap, allow_recompute=rc, policy=policy)
                assert Simulator(p, b, **kw).run() == _Uncached(p, b, **kw).run(), (frac, swap, rc, policy)


@pytest.mark.parametrize("below", [True, False])
def test_bisection_stays_within_the_time_limit(below):
    p = training_graph(300, 1)
    p = p.with_budget(p.floor_bytes - 1 if below else p.floor_bytes)
    limit = 2.0
    t0 = time.perf_counter()
    s = solve(p, time_limit_s=limit, workers=1, seed=0)
    wall = time.perf_counter() - t0
    assert s.ok and s.budget_bytes >= p.floor_bytes
    assert replay(p, s.events, s.budget_bytes).peak_bytes <= s.budget_bytes
    assert wall <= 1.5 * limit + 1.0, wall  # 20% in practice; slack for a loaded CI host


def test_greedy_run_is_abandoned_past_stop_at():
    """A run that passes its deadline returns nothing (solve then keeps its earlier schedules)."""
    p = adjoint_chain(40, slots=4)
    assert greedy(p, p.budget_bytes) is not None
    assert greedy(p, p.budget_bytes, limits=Limits(stop_at=time.perf_counter() - 1.0)) is None


def test_bisection_drops_to_the_peak_of_each_schedule_found():
    calls = []

    def probe(b):
        calls.append(b)
        return 1000 if b >= 1000 else None

    assert min_feasible_budget(probe, 10, 10**6) == 1000
    assert len(calls) <= 9, calls  # plain halving would need ~18 probes to reach 0.5% of 1000


def test_a_failed_probe_that_takes_the_share_still_leaves_a_budget_below_the_peak():
    """Probes sit BISECT_SPLIT of the way up: a met budget is found before the slow failure uses the share."""

    def probe(b):
        if b >= 600:
            return b - 50
        time.sleep(0.05)  # the failure takes the whole share
        return None

    assert min_feasible_budget(probe, 0, 1000, deadline=time.perf_counter() + 0.02) == 700


def test_the_bisection_does_not_depend_on_wall_time(monkeypatch, wide_wall_nets):
    """The probes' work is charged to a deterministic allowance, not read off the clock: with every probe slowed
    by 100 ms of wall time (a slow or loaded machine), the bisection probes the same budgets, charges the same
    work and raises the requested one to the same budget (it fails if wall time is charged). Recompute only at
    1.1 x the floor on a 300-op layered DAG: not met. (The wall-clock probes of before also probed the same
    budgets here, their share not being reached; the mechanism itself is tested below.) The wall-clock nets are
    widened, so the probes end on their allowance, not on the call's deadline, on a slower host too (on a day the
    probes took 1.7x their charge in wall time, the default deadline cut them and the probes differed in every
    run; halving the work rates was not enough on CI's host at stop 68)."""
    # the run from scratch is tested so in test_schedule_scratch; here it would take most of the allowance
    monkeypatch.setattr(fast, "from_scratch", lambda *args, **kwargs: Polished(None, None))
    p = layered_graph(300, 0)
    p = p.with_budget(int(1.1 * p.floor_bytes))
    real_probe = fast.least_memory_chain  # the start of every probe
    runs = []
    for delay in (0.0, 0.1):
        probed: list[int] = []

        def slow_probe(ctx, delay=delay, probed=probed):
            probed.append(ctx.budget)
            time.sleep(delay)
            return real_probe(ctx)

        monkeypatch.setattr(fast, "least_memory_chain", slow_probe)
        s = solve(p, time_limit_s=4.0, workers=1, seed=0, options=SolveOptions(settings=wide_wall_nets()))
        assert s.extra["budget_status"] == "not_found" and s.budget_bytes > p.budget_bytes
        runs.append((probed, s.budget_bytes, s.extra["bisection_work_seconds"]))
    assert len(runs[0][0]) >= 1  # a probe (after the raised plan, which takes its work)
    assert runs[0] == runs[1]


def test_an_unmet_budget_is_raised_no_higher_than_the_raised_plan_reaches():
    """The bisection starts from one DTR-style plan that raises its budget where it is stuck (dtr.raised_plan):
    recompute only at 1.1x the floor of a 300-op layered DAG, where recomputing from scratch fails for lack of
    work, the budget returned is at most that plan's peak, below the plain peak (before the plan, the run from
    scratch used the allowance and the budget went back to the plain peak), and the schedule replays within it."""
    from trainplan.schedule.dtr import raised_plan
    p = layered_graph(300, 0, swap=False)
    p = p.with_budget(int(1.1 * p.floor_bytes))
    plain = independent_replay(p, no_recompute_events(p)).peak_bytes
    plan = raised_plan(p, p.budget_bytes, int(DEFAULTS.raise_step * p.budget_bytes), plain - 1)
    reached = independent_replay(p, plan).peak_bytes
    s = solve(p, time_limit_s=4.0, workers=1, seed=0)
    assert s.extra["budget_status"] == "not_found"
    assert p.budget_bytes < s.budget_bytes <= reached < plain
    assert independent_replay(p, s.events, s.budget_bytes).peak_bytes <= s.budget_bytes


def test_a_budget_the_bisection_meets_is_reported_met_not_raised(monkeypatch):
    """Where the first attempt finds nothing (here: made to, as when it runs out of time) and the bisection's
    raised plan fits the requested budget without raising it, the answer is a schedule at the requested budget,
    `met`, not a raised budget with `not_found`."""
    from trainplan.schedule.schedule_io import no_schedule, set_budget_status
    p = layered_graph(100, 0, swap=False)
    p = p.with_budget(int(0.8 * independent_replay(p, no_recompute_events(p)).peak_bytes))
    real, budgets = portfolio.run_attempt, []

    def first_finds_nothing(ctx):
        budgets.append(ctx.budget)
        if len(budgets) == 1:
            return set_budget_status(no_schedule(ctx.budget, "ours", 0.0, "out of time", {}), "not_found")
        return real(ctx)

    monkeypatch.setattr(portfolio, "run_attempt", first_finds_nothing)
    s = solve(p, time_limit_s=2.0, workers=1, seed=0)
    assert budgets == [p.budget_bytes, p.budget_bytes]
    assert s.ok and s.extra["budget_status"] == "met" and s.budget_bytes == p.budget_bytes
    assert "requested_budget_bytes" not in s.extra
    assert 0 < s.extra["first_feasible_seconds"] <= s.solve_seconds  # counted from the call's start
    assert independent_replay(p, s.events, p.budget_bytes).time == s.time


def test_probe_work_is_charged_to_its_allowance_and_stops_there(monkeypatch):
    """A probe's DTR-style plans and greedy runs are charged by their work units (the same on every run), and a
    smaller allowance stops them: the probe then ends with the allowance spent, having found nothing. (The
    last-compute search, which takes a share of what is left, is left out: see test_schedule_last_compute.)"""
    no_search = replace(DEFAULTS, probe_search_share=0.0)
    p = layered_graph(300, 0)
    p = p.with_budget(int(1.1 * p.floor_bytes))  # no fast schedule meets it (recomputing from scratch: 1.2x the floor)
    probe = FastOptions(first_only=True, chain_dp=False)
    charged = []
    for _ in range(2):
        allowance = dl.Allowance(100.0)
        assert best_heuristic(p, probe, allowance, no_search)[0] is None
        charged.append(100.0 - allowance.seconds)
    assert charged[0] > 0 and charged[0] == charged[1]
    small = dl.Allowance(charged[0] / 4)
    assert best_heuristic(p, probe, small, no_search)[0] is None
    assert small.spent() and -small.seconds < charged[0] / 4


def test_a_probe_makes_only_the_plans_that_hold_no_input(monkeypatch):
    """A bisection probe (first_only) asks only whether a budget can be met: it makes the DTR-style plans that
    hold no input past its last reader (they fail sooner where no plan exists); a full run makes both kinds."""
    import trainplan.schedule.dtr as dtr
    p = layered_graph(150, 0)
    p = p.with_budget(int(0.8 * replay(p, no_recompute_events(p)).peak_bytes))
    made: list[bool] = []
    real_plan = dtr._plan

    def recording_plan(*args, **kwargs):
        made.append(args[2].hold)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(dtr, "_plan", recording_plan)
    probe = FastOptions(first_only=True, chain_dp=False)
    assert best_heuristic(p, probe, dl.Allowance(100.0))[0] is not None
    assert made and not any(made)
    made.clear()
    assert best_heuristic(p, FastOptions(deadline_s=1.0))[0] is not None
    assert set(made) == {False, True}


def test_a_greedy_run_past_its_work_cap_is_abandoned():
    p = layered_graph(120, 0)
    budget = int(0.85 * replay(p, no_recompute_events(p)).peak_bytes)
    events = greedy(p, budget, allow_swap=False, policy="cost")
    assert events is not None
    assert greedy(p, budget, allow_swap=False, policy="cost", limits=Limits(work_cap=10**9)) == events
    assert greedy(p, budget, allow_swap=False, policy="cost", limits=Limits(work_cap=p.n)) is None


def test_greedy_variants_equal_on_a_problems_flags_run_once():
    runs = greedy_variants(layered_graph(50, 0, swap=False))  # no op can be swapped
    assert [r[1:] for r in runs] == [(True, False, "belady"), (True, True, "cost"), (True, True, "belady")]
    assert runs == greedy_variants(layered_graph(50, 0, swap=False)) and len(greedy_variants(layered_graph(
        50, 0, swap=True))) == 6
    # where ops can be swapped, the swap-only runs of both policies come first, then the four other variants
    assert [r[1:] for r in greedy_variants(layered_graph(50, 0, swap=True))[:2]] == [
        (True, False, "belady"), (True, False, "cost")]


@pytest.mark.parametrize("n,seed", [(60, 2), (100, 0), (150, 1)])  # the cost policy swaps best on these
def test_ours_is_never_worse_than_the_swap_only_baseline(n, seed, monkeypatch):
    """The swap_only baseline is the better of the two policies' swap-only runs; ours runs both before anything
    else, so even with no time for more (heuristics' share 0, no DTR-style plan: it used to run the cost policy
    last and skip it) its first schedule is no worse, and neither is its answer."""
    p = layered_graph(n, seed, swap=True)
    prob = p.with_budget(int(1.1 * p.floor_bytes))
    base = solve(prob, 1.0, method="swap_only")
    assert base.ok
    base_time = replay(prob, base.events).time
    belady = greedy(prob, prob.budget_bytes, allow_recompute=False, policy="belady")
    assert base_time < replay(prob, belady).time  # the case at hand: Belady alone is worse than the baseline
    monkeypatch.setattr(fast, "dtr_plan", lambda *args, **kwargs: None)
    events, *_ = best_heuristic(prob, FastOptions(deadline_s=0.0))
    assert independent_replay(prob, events, prob.budget_bytes).time <= base_time
    ours = solve(prob, 1.0)
    assert ours.ok and independent_replay(prob, ours.events, prob.budget_bytes).time <= base_time


def test_with_swap_every_budget_above_the_floor_is_met_at_once():
    """Where every op can be swapped, the swap-only Belady run meets 1.1 x the floor on a wide 1000-op DAG (before,
    the DTR-style plans used the first attempt's share failing, and the budget was raised 1.4x)."""
    p = layered_graph(1000, 3, swap=True)
    p = p.with_budget(int(1.1 * p.floor_bytes))
    s = solve(p, time_limit_s=2.0, workers=1, seed=0)
    assert s.ok and s.extra["budget_status"] == "met" and s.budget_bytes == p.budget_bytes
    assert s.extra["first_feasible_seconds"] < 0.5
    r = independent_replay(p, s.events, p.budget_bytes)
    assert r.peak_bytes <= p.budget_bytes and r.time == pytest.approx(s.time)


def test_mip_is_not_built_past_its_size_cap(monkeypatch):
    p = training_graph(40, 3)
    peak = replay(p, no_recompute_events(p)).peak_bytes
    ncop = [2 if (op.recompute or op.swap) else 1 for op in p.ops]
    built = solve_mip(p, peak, CpSatRun(1.0), ModelSpec(copies=2))
    assert abs(model_variables(p, ncop) - built.stats["variables"]) <= 0.15 * built.stats["variables"]
    monkeypatch.setattr(mip, "MAX_MODEL_VARIABLES", 100)
    skipped = solve_mip(p, peak, CpSatRun(1.0), ModelSpec(copies=2))
    assert skipped.status == "SKIPPED" and skipped.events is None and "not built" in skipped.stats["note"]


@pytest.mark.parametrize("workers", [1, 2])
def test_deterministic_shares_do_not_depend_on_wall_time(monkeypatch, workers, wide_wall_nets):
    """Each CP-SAT step's deterministic limit comes from what the steps before it used on their deterministic
    clocks, not from the wall clock: a second of delay in a step without CP-SAT (a slow or loaded machine)
    leaves every limit, the bound and the events as they were. ``training_graph(40, 0)`` at 1.1 x floor
    runs the relaxation, the restricted model, the staged model and the full model (beside it with 2
    workers). Every deterministic limit is cut to a quarter, so each step ends on it, not on its wall-clock cap,
    on a host slower than the one the rates were fitted on: on a day this host ran CP-SAT about 2x slower, with
    the full limits the run without delay took 5.3 s of its 6 s and the delayed one ran fewer LNS windows (every
    run, 1 worker); with half the limits 2 of 7 runs differed (2 workers); with a quarter, none of 11. The
    wall-clock nets are widened too (``wide_wall_nets``) for slower CI hosts."""
    real_configure = mip.configure

    def quarter_limit(*args, **kwargs):
        solver = real_configure(*args, **kwargs)
        solver.parameters.max_deterministic_time /= 4
        return solver

    for module in (mip, bounds, staged_bound):
        monkeypatch.setattr(module, "configure", quarter_limit)
    p = training_graph(40, 0)
    p = p.with_budget(int(1.1 * p.floor_bytes))
    main_limits: list[float] = []  # the steps in order, in the calling thread
    beside_limits: list[float] = []  # CP-SAT beside the staged model (2 workers): its search, then LNS windows
    real_solve, real_guided = cp_model.CpSolver.Solve, improve.guided

    def recording_solve(solver, model, *args):
        main = threading.current_thread() is threading.main_thread()
        (main_limits if main else beside_limits).append(solver.parameters.max_deterministic_time)
        return real_solve(solver, model, *args)

    def slow_guided(*args, **kwargs):
        time.sleep(1.0)
        return real_guided(*args, **kwargs)

    monkeypatch.setattr(cp_model.CpSolver, "Solve", recording_solve)
    runs = []
    for guided in (real_guided, slow_guided):
        monkeypatch.setattr(improve, "guided", guided)
        main_limits.clear()
        beside_limits.clear()
        s = solve(p, time_limit_s=6, workers=workers, seed=0,
                  options=SolveOptions(bisect=False, deterministic=True, settings=wide_wall_nets()))
        runs.append((list(main_limits), list(beside_limits), s.bound, s.events, s.extra["mip"].get("stopped")))
    assert len(runs[0][0]) + len(runs[0][1]) >= 4
    assert runs[0][0] == runs[1][0]  # every step of the calling thread
    assert runs[0][2:4] == runs[1][2:4]  # the bound and the events
    (_, beside_a, *_, stopped_a), (_, beside_b, *_, stopped_b) = runs
    if stopped_a or stopped_b:
        # the staged model proved the schedule and stopped CP-SAT beside it (whose answer is then not used) at
        # a wall-clock moment (in a run where CP-SAT had already ended, nothing was stopped): how many of its LNS
        # windows had started by then may differ, never their limits
        common = min(len(beside_a), len(beside_b))
        assert common >= 1 and beside_a[:common] == beside_b[:common]
    else:
        assert beside_a == beside_b


def test_a_greedy_run_slower_than_its_time_cap_is_abandoned():
    p = layered_graph(120, 0)
    budget = int(0.85 * replay(p, no_recompute_events(p)).peak_bytes)
    events = greedy(p, budget, allow_swap=False, policy="cost")
    assert events is not None
    t = replay(p, events, budget).time
    assert greedy(p, budget, allow_swap=False, policy="cost", limits=Limits(time_cap=t)) == events  # as fast: kept
    assert greedy(p, budget, allow_swap=False, policy="cost", limits=Limits(time_cap=0.999 * t)) is None


def test_a_schedule_found_in_the_shortened_attempt_gets_the_rest_of_the_limit(monkeypatch):
    """No fast schedule fits, so the budget looks infeasible and the attempt gets a share of the limit; CP-SAT
    finds one there: the rest of the limit improves it (CP-SAT from it, then LNS), never to a worse one."""
    p = layered_graph(80, 0)
    p = p.with_budget(int(0.85 * replay(p, no_recompute_events(p)).peak_bytes))
    no_fast = tuple(s for s in portfolio.PORTFOLIO if s.phase != portfolio.FAST)  # no fast schedule, in probes too
    monkeypatch.setattr(portfolio, "PORTFOLIO", no_fast)
    s = solve(p, 8, 2, 0)
    assert s.ok and s.extra["budget_status"] == "met" and s.budget_bytes == p.budget_bytes
    improve = s.extra["improve_mip"]
    assert s.time <= improve["objective_before"] + 1e-9
    assert replay(p, s.events, p.budget_bytes).time == s.time
