"""A pipeline stage whose rank is over budget with the other in-flight stashes held is solved again with its stash
held to a cap: the schedule kept meets the rank's budget, holds at most the cap at its split, and is stored with
the problem it was solved on, less the stand-in workspace."""

from __future__ import annotations

from trainplan.schedule import replay
from trainplan.schedule.pipeline_hold import stash_bytes
from trainplan.schedule.problem import problem_from_dict
from trainplan.schedule.solve import solve
from trainplan.schedule.stash_cap import capped, rank_peak, smaller_stash, split_op, uncapped


def pipeline_toy(rank_budget: int) -> dict:
    """Forward f1..f4 (100 B each), backward g4..g1, g1 with a 500 B workspace (the stage's floor); one other
    micro-batch in flight, no sums or carriers: its no-recompute stash is f1..f4."""
    ops = [{"id": f"f{i}", "time": 1.0, "bytes": 100, "inputs": [f"f{i - 1}"] if i > 1 else [], "phase": "forward"}
           for i in range(1, 5)]
    ops += [{"id": "g4", "time": 1.0, "bytes": 10, "inputs": ["f4", "f3"], "phase": "backward"},
            {"id": "g3", "time": 1.0, "bytes": 10, "inputs": ["g4", "f2"], "phase": "backward"},
            {"id": "g2", "time": 1.0, "bytes": 10, "inputs": ["g3", "f1"], "phase": "backward"},
            {"id": "g1", "time": 1.0, "bytes": 10, "inputs": ["g2"], "phase": "backward", "workspace": 500}]
    hold = {"in_flight": 2, "gradient_sum_bytes": 0, "carrier_bytes": 0, "no_recompute_stash_bytes": 400,
            "rank_budget_bytes": rank_budget, "reserve_bytes": 400}
    return {"ops": ops, "fixed_bytes": 0, "budget_bytes": rank_budget - 400, "bandwidth": 1.0, "keep": ["g1"],
            "pipeline": hold}


def ours(problem: dict, seconds: float):
    return solve(problem_from_dict(problem), seconds, 1, 0)


def test_the_cap_bounds_what_is_resident_at_the_split():
    p = pipeline_toy(800)
    assert split_op(p)["id"] == "g4"
    c = capped(p, 200)
    assert c["budget_bytes"] == 600 and c["pipeline"]["stash_cap_bytes"] == 200
    assert c["ops"][4]["workspace"] == 600 - 10 - 200  # what g4 may hold beside its output and the cap
    assert problem_from_dict(uncapped(c)).ops == problem_from_dict(p).ops
    found = ours(c, 5.0)
    assert found.ok and stash_bytes(c, found.events) <= 200


def test_a_rank_over_budget_is_solved_again_with_a_smaller_stash():
    p = pipeline_toy(800)
    first = ours(p, 5.0)  # raised to the floor, where it keeps f1..f4 for the other micro-batch too
    assert first.status == "raised" and stash_bytes(p, first.events) == 400
    assert rank_peak(p, first) > 800
    kept, found = smaller_stash(p, first, ours, 6.0)
    cap = kept["pipeline"]["stash_cap_bytes"]
    assert cap < 400 and found.extra["stash_cap_bytes"] == cap
    assert all("stash_cap_workspace" not in op for op in kept["ops"])
    # independent: the schedule replayed on the stored problem, plus the other micro-batch's stash at the split
    peak = replay(problem_from_dict(kept), found.events).peak_bytes
    assert peak == found.peak_bytes and peak + stash_bytes(kept, found.events) == rank_peak(kept, found) <= 800
    assert stash_bytes(kept, found.events) <= cap and found.extra["recomputes"] > 0


def test_a_rank_within_budget_or_below_its_floor_keeps_the_first_schedule():
    p = pipeline_toy(2000)
    first = ours(p, 2.0)
    assert smaller_stash(p, first, ours, 2.0) == (p, first)
    p = pipeline_toy(450)  # less than the floor (g1's 500 B workspace) beside any stash
    first = ours(p, 2.0)
    assert smaller_stash(p, first, ours, 2.0) == (p, first)
