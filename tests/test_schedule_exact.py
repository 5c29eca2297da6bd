"""Our optimiser against an independent exact search on small instances; monotonicity; bisection."""

import random

import pytest

from schedule_exact import exact_min_time
from trainplan.schedule import SolveOptions, problem_from_dict, replay, solve
from trainplan.schedule.baselines import no_recompute_events
from trainplan.schedule.settings import DEFAULTS
from trainplan.schedule.synthetic import random_dag, training_graph


def instance(seed: int):
    """Random DAGs (with recompute/swap flags) and tiny training graphs, budget in [floor, no-recompute peak]."""
    rng = random.Random(seed)
    n = 5 + seed % 5
    if seed % 2:
        p = training_graph(n, seed, bandwidth=rng.choice([1e9, 1e10, 1e11]))
    else:
        p = random_dag(n, seed)
    peak = replay(p, no_recompute_events(p)).peak_bytes
    return p.with_budget(p.floor_bytes + int(rng.random() * (peak - p.floor_bytes)))


@pytest.mark.parametrize("seed", range(40))
def test_ours_matches_exact_search(seed):
    p = instance(seed)
    exact = exact_min_time(p, p.budget_bytes)
    sched = solve(p, time_limit_s=5, workers=1, seed=0, options=SolveOptions(bisect=False))
    if exact is None:
        assert sched.status == "infeasible"
        return
    assert sched.status == "optimal"
    assert sched.time == pytest.approx(exact, rel=1e-9)
    rep = replay(p, sched.events, p.budget_bytes)
    assert (rep.time, rep.peak_bytes) == (sched.time, sched.peak_bytes)


def test_exact_search_sees_swap_and_recompute():
    """The instances above exercise both mechanisms (otherwise the comparison proves little)."""
    used = set()
    for seed in range(40):
        p = instance(seed)
        sched = solve(p, time_limit_s=5, workers=1, seed=0, options=SolveOptions(bisect=False))
        if sched.ok:
            used |= {k for k in ("recomputes", "swap_ins") if sched.extra[k]}
    assert used == {"recomputes", "swap_ins"}


@pytest.mark.parametrize("seed", [2, 9, 14])
def test_budget_monotonicity(seed):
    p = random_dag(9, seed)
    peak = replay(p, no_recompute_events(p)).peak_bytes
    budgets = sorted({p.floor_bytes + (peak - p.floor_bytes) * k // 4 for k in range(5)}, reverse=True)
    times = []
    for b in budgets:
        s = solve(p, time_limit_s=5, workers=1, seed=0, options=SolveOptions(budget_bytes=b, bisect=False))
        if s.ok:
            assert s.status == "optimal"
            times.append(s.time)
    assert times == sorted(times) and len(times) >= 2


PINNED = problem_from_dict({
    # x can be neither swapped nor recomputed, so it stays through a and b: the need is 40 B while
    # the floor (largest single op with its inputs) is only 30 B.
    "ops": [{"id": "x", "time": 1, "bytes": 10, "inputs": [], "recompute": False, "swap": False},
            {"id": "a", "time": 1, "bytes": 20, "inputs": ["x"]},
            {"id": "b", "time": 1, "bytes": 10, "inputs": ["a"]},
            {"id": "c", "time": 1, "bytes": 10, "inputs": ["b", "x"]}],
    "budget_bytes": 30, "bandwidth": 5, "keep": ["c"]})


def test_infeasible_budget_bisects_to_smallest_feasible():
    assert PINNED.floor_bytes == 30 and exact_min_time(PINNED, 30) is None
    s = solve(PINNED, time_limit_s=2, workers=1, seed=0)
    assert s.ok and s.extra["requested_budget_bytes"] == 30 and "infeasible" in s.extra["note"]
    replay(PINNED, s.events, s.budget_bytes)
    assert exact_min_time(PINNED, s.budget_bytes) is not None
    assert exact_min_time(PINNED, int(s.budget_bytes * (1 - DEFAULTS.bisect_tolerance)) - 1) is None


@pytest.mark.parametrize("seed", [1, 3])
def test_bisection_minimal_on_random_instances(seed):
    p = random_dag(8, seed)
    p = p.with_budget(p.floor_bytes - 1)
    s = solve(p, time_limit_s=2, workers=1, seed=0)
    assert s.ok and s.budget_bytes >= p.floor_bytes
    assert replay(p, s.events, s.budget_bytes).peak_bytes <= s.budget_bytes
    below = int(s.budget_bytes * (1 - DEFAULTS.bisect_tolerance)) - 1
    assert below < p.floor_bytes or exact_min_time(p, below) is None


def test_deterministic_for_a_fixed_seed(wide_wall_nets):
    p = training_graph(40, 3)
    peak = replay(p, no_recompute_events(p)).peak_bytes
    p = p.with_budget(p.fixed_bytes + (peak - p.fixed_bytes) // 2)
    # 3 s: at 1 s a step's wall-clock safety net binds on a slow host (2026-12-02: 1 run in 4 differed alone on
    # this 2-core machine, 0 in 14 at 3 s), and only then may the answer change (schedule/mip.py, configure); the
    # nets widened for slower CI hosts
    options = SolveOptions(settings=wide_wall_nets())
    a = solve(p, time_limit_s=3, workers=2, seed=5, options=options)
    b = solve(p, time_limit_s=3, workers=2, seed=5, options=options)
    assert a.events == b.events and a.time == b.time
