"""The DTR-style eviction plan: valid under the budget on wide layered DAGs, and cheaper than the greedy."""

import pytest

from trainplan.schedule.baselines import no_recompute_events
from trainplan.schedule.dtr import dtr_plan, plain_memory
from trainplan.schedule.heuristic import POLICIES, greedy
from trainplan.schedule.replay import replay
from trainplan.schedule.synthetic import layered_graph


def test_plain_memory_matches_the_no_recompute_replay():
    p = layered_graph(300, 4)
    mem, _ = plain_memory(p)
    assert max(mem) == replay(p, no_recompute_events(p)).peak_bytes


@pytest.mark.parametrize("seed, swap, frac", [(0, False, 0.9), (0, False, 0.8), (3, True, 0.8), (5, True, 0.7)])
def test_plan_fits_and_beats_the_greedy(seed, swap, frac):
    p = layered_graph(250, seed, swap=swap)
    budget = int(frac * replay(p, no_recompute_events(p)).peak_bytes)
    events = dtr_plan(p, budget, allow_swap=swap, restarts=2)
    assert events is not None
    rep = replay(p, events, budget)  # raises if invalid or over the budget
    assert rep.peak_bytes <= budget and rep.time >= p.compute_time
    if not swap:
        assert rep.swap_ins == 0
    others = [greedy(p, budget, allow_swap=swap, policy=policy) for policy in POLICIES]
    times = [replay(p, e).time for e in others if e is not None]
    assert all(rep.time <= t for t in times), (rep.time, times)


def test_restarts_are_reproducible():
    p = layered_graph(200, 2)
    budget = int(0.8 * replay(p, no_recompute_events(p)).peak_bytes)
    assert dtr_plan(p, budget, restarts=3, seed=7) == dtr_plan(p, budget, restarts=3, seed=7)
