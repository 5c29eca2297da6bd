"""The linear adjoint chain: our exact optimum against the exact search and revolve's published optimum."""

import math

import pytest

from schedule_exact import exact_min_time
from trainplan.schedule import SolveOptions, solve
from trainplan.schedule.chain import adjoint_chain, chain_min_steps, revolve_min_steps


def revolve_recursion(length: int, snapshots: int) -> int:
    """Griewank's recursion for in-place advancing (independent of the closed form)."""
    t = [[0] * (length + 1) for _ in range(snapshots + 1)]
    for c in range(1, snapshots + 1):
        for n in range(2, length + 1):
            if c == 1:
                t[c][n] = n * (n - 1) // 2
            else:
                t[c][n] = min(j + t[c - 1][n - j] + t[c][j] for j in range(1, n))
    return t[snapshots][length]


@pytest.mark.parametrize("length", range(1, 9))
def test_chain_optimum_matches_exact_search(length):
    for slots in range(1, 6):
        exact = exact_min_time(adjoint_chain(length), slots * 1000)
        dp = chain_min_steps(length, slots)
        assert (math.inf if exact is None else exact) == dp, (length, slots)


def test_revolve_closed_form():
    for length in range(1, 40):
        for c in range(1, 6):
            assert revolve_min_steps(length, c) == revolve_recursion(length, c), (length, c)
    assert revolve_min_steps(100, 1) == 100 * 99 // 2


def test_published_optimum_brackets_ours():
    """Not advancing in place costs at most one snapshot: revolve(slots-1) <= ours(slots) <= revolve(slots-2)."""
    for length in range(1, 201):
        for slots in range(3, 11):
            ours = chain_min_steps(length, slots)
            assert revolve_min_steps(length, slots - 1) <= ours <= revolve_min_steps(length, slots - 2)


@pytest.mark.parametrize("length,slots", [(4, 3), (6, 3), (8, 4), (8, 5), (12, 6)])
def test_solver_finds_the_chain_optimum(length, slots):
    p = adjoint_chain(length, slots=slots)
    sched = solve(p, time_limit_s=5, workers=1, seed=0, options=SolveOptions(bisect=False))
    assert sched.status == "optimal"
    assert sched.time == chain_min_steps(length, slots)


@pytest.mark.parametrize("length,slots", [(20, 4), (30, 6)])
def test_solver_on_longer_chains_respects_the_optimum(length, slots):
    """Neither the schedule nor the reported lower bound may cross the exact optimum."""
    p = adjoint_chain(length, slots=slots)
    sched = solve(p, time_limit_s=2, workers=1, seed=0, options=SolveOptions(bisect=False))
    optimum = chain_min_steps(length, slots)
    assert sched.ok and sched.time >= optimum
    assert sched.bound <= optimum


def test_chain_errors():
    with pytest.raises(ValueError, match="length"):
        adjoint_chain(0)
