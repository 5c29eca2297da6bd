"""Window LNS (schedule/lns.py) after a hinted CP-SAT run: never worse, and its answer is a valid schedule
whose cost, recomputed from the events, is the objective it reports."""

from __future__ import annotations

import pytest

from trainplan.schedule import replay
from trainplan.schedule.baselines import no_recompute_events
from trainplan.schedule.lns import WINDOW_BLOCKS, _windows
from trainplan.schedule.mip import objective_ticks, solve_mip, time_unit
from trainplan.schedule.synthetic import layered_graph


def test_windows_cover_the_order_with_half_window_overlap():
    base = [3 * b for b in range(101)]  # 100 blocks of 3 positions, and the final block
    wins = _windows(100, base, 305)
    assert wins[0] == (0, base[WINDOW_BLOCKS]) and wins[-1][1] == 305
    assert all(b[0] - a[0] == 3 * (WINDOW_BLOCKS // 2) for a, b in zip(wins, wins[1:]))


@pytest.mark.parametrize("deterministic", [True, False])
def test_lns_improves_a_first_solution_to_a_valid_schedule(deterministic):
    p = layered_graph(100, 0)  # recompute only, 80% of the plain order's peak: CP-SAT's first solution is poor
    p = p.with_budget(int(0.8 * replay(p, no_recompute_events(p)).peak_bytes))
    first = solve_mip(p, p.budget_bytes, time_limit_s=4, workers=2, seed=0, deterministic=deterministic)
    assert first.events is not None  # LNS takes over from a hinted run: hint a first CP-SAT solution
    r = solve_mip(p, p.budget_bytes, time_limit_s=8, workers=2, seed=0, deterministic=deterministic,
                  hint=first.events, lns_share=0.5)
    lns = r.stats["lns"]
    assert r.events is not None and lns is not None and lns["windows"] > 0
    assert lns["objective"] <= lns["objective_before"] and r.objective_s == lns["objective"] <= first.objective_s
    rep = replay(p, r.events, p.budget_bytes)  # raises if invalid or over the budget
    assert rep.peak_bytes <= p.budget_bytes
    assert objective_ticks(p, r.events) * time_unit(p) == pytest.approx(lns["objective"])
