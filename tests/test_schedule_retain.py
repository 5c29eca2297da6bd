"""Keeping a recomputed tensor for its next use instead of recomputing it again (schedule.retain)."""

import pytest

from trainplan.schedule import problem_from_dict
from trainplan.schedule.baselines import no_recompute_events
from trainplan.schedule.dtr import Effort, _events, _Gaps, _Plan, _Rules
from trainplan.schedule.deadline import NEVER
from trainplan.schedule.replay import ScheduleError, replay
from trainplan.schedule.retain import retain_recomputes
from trainplan.schedule.synthetic import layered_graph


def _problem(budget: int):
    # w -> x -> (y1, y2), with a 50-byte tensor read by y1: w and x are dropped and recomputed in between
    return problem_from_dict({"ops": [{"id": "w", "time": 2, "bytes": 10},
                                      {"id": "x", "time": 5, "bytes": 10, "inputs": ["w"]},
                                      {"id": "big", "time": 1, "bytes": 50},
                                      {"id": "y1", "time": 1, "bytes": 1, "inputs": ["x", "big"]},
                                      {"id": "y2", "time": 1, "bytes": 1, "inputs": ["x", "y1"]}],
                              "budget_bytes": budget, "bandwidth": 1.0, "keep": ["y2"]})


# x is made, freed, recomputed (with w) for y1, freed, and recomputed (with w) for y2
EVENTS = [("compute", "w"), ("compute", "x"), ("free", "w"), ("free", "x"), ("compute", "big"),
          ("compute", "w"), ("compute", "x"), ("free", "w"), ("compute", "y1"), ("free", "big"), ("free", "x"),
          ("compute", "w"), ("compute", "x"), ("free", "w"), ("compute", "y2"), ("free", "x"), ("free", "y1")]


def test_a_recompute_with_room_is_replaced_by_keeping_the_tensor_and_its_feeder_recompute_goes():
    p = _problem(budget=100)
    before = replay(p, EVENTS, 100)
    out = retain_recomputes(p, EVENTS, 100)
    after = replay(p, out, 100)  # valid under the budget
    # both recomputes of x are merged into the first compute (x kept: +10 bytes beside big's 50); with x
    # gone, the recomputes of w feed nothing and are deleted too
    assert after.recomputes == 0 and before.recomputes == 4
    assert after.time == before.time - 2 * (5 + 2) and after.peak_bytes <= 100
    assert out.count(("compute", "x")) == 1 and out.count(("compute", "w")) == 1


def test_recomputes_that_nothing_reads_are_deleted_with_the_recomputes_feeding_them():
    """After b, the last op, a and c are recomputed and freed unread (as a CP-SAT probe's schedule of a Llama did,
    after the parameter's update): both go; the first computes stay."""
    p = problem_from_dict({"ops": [{"id": "a", "time": 3, "bytes": 10},
                                   {"id": "c", "time": 2, "bytes": 10, "inputs": ["a"]},
                                   {"id": "b", "time": 1, "bytes": 1, "inputs": ["c"]}],
                           "budget_bytes": 100, "bandwidth": 1.0, "keep": ["b"]})
    made = [("compute", "a"), ("compute", "c"), ("free", "a"), ("compute", "b"), ("free", "c")]
    events = [*made, ("compute", "a"), ("compute", "c"), ("free", "a"), ("free", "c")]
    assert replay(p, events).recomputes == 2
    out = retain_recomputes(p, events, 100)
    assert out == made and replay(p, out).time == replay(p, events).time - 5


def test_a_merge_is_made_only_where_the_tensor_fits_at_every_event_in_between():
    # x is freed before a 60-byte spike z and recomputed after it: keeping x through z needs 70 bytes
    p = problem_from_dict({"ops": [{"id": "x", "time": 5, "bytes": 10},
                                   {"id": "z", "time": 1, "bytes": 60},
                                   {"id": "y", "time": 1, "bytes": 1, "inputs": ["x"]}],
                           "budget_bytes": 70, "bandwidth": 1.0, "keep": ["y"]})
    events = [("compute", "x"), ("free", "x"), ("compute", "z"), ("free", "z"), ("compute", "x"),
              ("compute", "y"), ("free", "x")]
    assert replay(p, events).peak_bytes == 60
    assert retain_recomputes(p, events, 69) == events
    merged = retain_recomputes(p, events, 70)
    assert merged == [("compute", "x"), ("compute", "z"), ("free", "z"), ("compute", "y"), ("free", "x")]
    assert replay(p, merged, 70).time == replay(p, events).time - 5


def test_a_swapped_out_recompute_is_not_deleted():
    """w is recomputed to feed x's recompute and swapped out for z's swap-in. Keeping x instead leaves that w
    without a reader, but its host copy is read later: its compute, swap-out and free stay."""
    p = problem_from_dict({"ops": [{"id": "w", "time": 2, "bytes": 30},
                                   {"id": "x", "time": 5, "bytes": 5, "inputs": ["w"]},
                                   {"id": "big", "time": 1, "bytes": 50},
                                   {"id": "y", "time": 1, "bytes": 1, "inputs": ["x"]},
                                   {"id": "z", "time": 1, "bytes": 1, "inputs": ["w"]}],
                           "budget_bytes": 60, "bandwidth": 1.0, "keep": ["y", "z"]})
    events = [("compute", "w"), ("compute", "x"), ("free", "w"), ("free", "x"), ("compute", "big"),
              ("free", "big"), ("compute", "w"), ("compute", "x"), ("swap_out", "w"), ("free", "w"),
              ("compute", "y"), ("free", "x"), ("swap_in", "w"), ("compute", "z")]
    out = retain_recomputes(p, events, 60)  # x fits beside big (55 of 60 B); w does not
    assert out.count(("compute", "x")) == 1 and out.count(("compute", "w")) == 2
    assert replay(p, out, 60).time == replay(p, events, 60).time - 5


@pytest.mark.parametrize("n, seed, frac", [(300, 3, 0.8), (400, 7, 0.8), (200, 11, 0.9)])
def test_on_eviction_plans_of_unseen_layered_graphs_it_stays_valid_and_never_slower(n, seed, frac):
    p = layered_graph(n, seed)
    budget = int(frac * replay(p, no_recompute_events(p)).peak_bytes)
    plan = _Plan(p, budget, _Rules(False, n, early=True), Effort(NEVER))
    assert plan.relieve(None)
    raw = _events(p, _Gaps(p), plan.evicted, plan.by_swap, plan.chains)  # the plan's events before the pass
    before = replay(p, raw, budget)
    out = retain_recomputes(p, raw, budget)
    after = replay(p, out, budget)  # raises if invalid or over the budget
    assert after.peak_bytes <= budget
    assert after.time < before.time and after.recomputes < before.recomputes
    assert retain_recomputes(p, raw, budget) == out  # deterministic


def test_events_that_read_a_tensor_not_resident_are_refused_by_name():
    p = _problem(budget=100)
    with pytest.raises(ScheduleError, match="event 0 compute 'x'"):
        retain_recomputes(p, [("compute", "x"), ("compute", "w")], 100)
