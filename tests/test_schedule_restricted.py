"""CP-SAT restricted to the ops the relaxation rematerialises: valid schedules, optimal only at the bound."""

import pytest

from schedule_exact import exact_min_time
from test_schedule_exact import instance
from trainplan.schedule import SolveOptions, replay, solve
from trainplan.schedule.baselines import no_recompute_events
from trainplan.schedule.bounds import relaxation_bound
from trainplan.schedule.mip import CpSatRun, ModelSpec, solve_mip
from trainplan.schedule.portfolio import best_heuristic
from trainplan.schedule.synthetic import training_graph

RELAXATION = CpSatRun(5, workers=1, deterministic=False)  # the gap relaxation's run here


def at(p, fraction):
    peak = replay(p, no_recompute_events(p)).peak_bytes
    return p.with_budget(int(fraction * peak))


def rematerialised(p, events):
    """Ops computed more than once or swapped in."""
    seen, again = set(), set()
    for kind, oid in events:
        if kind == "swap_in" or (kind == "compute" and oid in seen):
            again.add(p.index[oid])
        seen.add(oid)
    return again


@pytest.mark.parametrize("seed", range(40))
def test_relaxation_bound_never_exceeds_the_exact_optimum(seed):
    p = instance(seed)
    exact = exact_min_time(p, p.budget_bytes)
    relax = relaxation_bound(p, p.budget_bytes, RELAXATION)
    assert relax.infeasible if exact is None else relax.seconds <= exact * (1 + 1e-9)


def test_restricted_model_rematerialises_only_the_named_ops():
    p = at(training_graph(60, 1), 0.5)
    relax = relaxation_bound(p, p.budget_bytes, RELAXATION)
    ops = frozenset(u for u, _ in relax.evict)
    res = solve_mip(p, p.budget_bytes, CpSatRun(5, workers=1), ModelSpec(lower_bound_ticks=relax.ticks, remat_ops=ops))
    assert res.events and rematerialised(p, res.events) <= ops
    assert replay(p, res.events, p.budget_bytes).time >= relax.seconds
    # with nothing allowed to be rematerialised the budget (half the no-recompute peak) cannot be met
    assert solve_mip(p, p.budget_bytes, CpSatRun(5, workers=1), ModelSpec(remat_ops=frozenset())).status == "INFEASIBLE"
    with pytest.raises(ValueError, match="remat_ops"):
        solve_mip(p, p.budget_bytes, spec=ModelSpec(hint=best_heuristic(p)[0], remat_ops=ops))


@pytest.mark.parametrize("seed, fraction", [(0, 0.7), (3, 0.6)])
def test_100_op_graph_is_proven_optimal_by_the_restricted_model(seed, fraction, wide_wall_nets):
    """The restricted model meets the relaxation bound, so the schedule is optimal among all schedules
    (CP-SAT's full model is skipped)."""
    p = at(training_graph(100, seed), fraction)
    s = solve(p, time_limit_s=10, workers=1, seed=0, options=SolveOptions(bisect=False, settings=wide_wall_nets()))
    assert s.status == "optimal" and s.extra["heuristic"] == "relaxation-restricted-mip"
    assert s.extra["restricted_mip"]["at_bound"] and s.extra["mip"]["status"] == "SKIPPED"
    assert "optimal_within" not in s.extra
    rep = replay(p, s.events, p.budget_bytes)
    assert (rep.time, rep.peak_bytes) == (s.time, s.peak_bytes)
    # equal to the bound up to rounding each rematerialisation down to whole 1 ns ticks
    events = s.extra["recomputes"] + s.extra["swap_ins"] + s.extra["swap_outs"]
    assert s.extra["relaxation"]["bound"] <= s.time <= s.extra["relaxation"]["bound"] + events * 1e-9
    assert s.time < replay(p, best_heuristic(p)[0]).time
