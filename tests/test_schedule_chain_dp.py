"""The chain DP: exact on the revolve benchmark, checked against the exact search on heterogeneous chains."""

import math
import random

import pytest

from schedule_exact import exact_min_time
from trainplan.schedule import SolveOptions, replay, solve
from trainplan.schedule.chain import adjoint_chain, chain_min_steps, heterogeneous_chain
from trainplan.schedule.chain_dp import chain_dp_events, chain_length
from trainplan.schedule.problem import Op, Problem
from trainplan.schedule.synthetic import training_graph


def test_chain_shape_is_recognised_and_nothing_else():
    assert chain_length(adjoint_chain(7)) == 7
    assert chain_length(training_graph(40, seed=0)) is None
    chain = adjoint_chain(5)
    broken = list(chain.ops)
    broken[3] = Op("x3", 1.0, 1000, ("x1",))  # x3 reads x1: no longer a chain
    assert chain_length(Problem(tuple(broken), chain.budget_bytes, chain.bandwidth, keep=chain.keep)) is None
    assert chain_dp_events(training_graph(40, seed=0), 10**12) is None


@pytest.mark.parametrize("length", [1, 2, 3, 9, 31, 60])
def test_equal_sizes_reach_the_exact_chain_optimum(length):
    for slots in range(1, 9):
        p = adjoint_chain(length, slots=slots)
        events = chain_dp_events(p, p.budget_bytes)
        optimum = chain_min_steps(length, slots)
        if events is None:
            assert optimum == math.inf, (length, slots)
            continue
        rep = replay(p, events, p.budget_bytes)
        assert (rep.time, rep.peak_bytes <= p.budget_bytes) == (optimum, True), (length, slots)


def test_heterogeneous_chains_against_the_exact_search():
    """Valid and never below the exact optimum; equal to it on almost every instance (the DP only
    searches the revolve recursion, which can miss the optimum when sizes differ)."""
    rng = random.Random(1)
    equal = worse = 0
    for _ in range(60):
        p = heterogeneous_chain(rng.randint(3, 5), rng.randrange(2**31))
        total = sum(op.bytes + op.workspace for op in p.ops)
        for frac in (0.5, 0.6, 0.7, 0.85):
            budget = int(frac * total)
            exact = exact_min_time(p, budget)
            events = chain_dp_events(p, budget)
            if events is None:
                assert exact is None
                continue
            rep = replay(p, events, budget)
            assert exact is not None and rep.time >= exact - 1e-9
            if rep.time <= exact * (1 + 1e-9):
                equal += 1
            else:
                worse += 1
    assert equal >= 150 and worse <= 0.02 * (equal + worse), (equal, worse)


def test_coarse_units_stay_within_the_budget():
    """Sizes with no useful gcd: memory is counted in rounded-up units, so the schedule still fits."""
    rng = random.Random(3)
    base = heterogeneous_chain(40, seed=7)
    ops = tuple(Op(o.id, o.time, o.bytes + rng.randint(1, 99), o.inputs, o.workspace, o.recompute, o.swap)
                for o in base.ops)
    p = Problem(ops, 10**9, 1e9, keep=base.keep)
    budget = sum(o.bytes for o in ops) // 4
    events = chain_dp_events(p, budget, max_work=1e6)
    assert events is not None
    assert replay(p, events, budget).peak_bytes <= budget


def test_solve_returns_the_chain_optimum():
    p = adjoint_chain(100, slots=4)
    sched = solve(p, 2.0, workers=1, options=SolveOptions(bisect=False))
    assert sched.time == chain_min_steps(100, 4) == 615
    assert sched.extra["heuristic"] == "chain-dp"


@pytest.mark.parametrize("seed", [0, 5])
def test_least_memory_schedule_is_the_least_budget_the_dp_fits(seed):
    p = heterogeneous_chain(25, seed)
    events = chain_dp_events(p, 10**6, least_memory=True)
    peak = replay(p, events).peak_bytes
    assert chain_dp_events(p, peak) is not None
    assert chain_dp_events(p, peak - 1) is None


def test_bisection_on_a_long_chain_reaches_the_least_memory():
    """One DP run per probe answers every smaller budget: the bisection ends at 3 states with the
    exact optimum there (it used to stop at its wall-clock share tens of states above)."""
    p = adjoint_chain(150, slots=2)  # 2 states is below what any schedule needs
    sched = solve(p, 4.0, workers=1)
    assert sched.budget_bytes == 3000 and sched.extra["requested_budget_bytes"] == 2000
    assert sched.time == chain_min_steps(150, 3) and replay(p, sched.events, 3000).peak_bytes <= 3000
