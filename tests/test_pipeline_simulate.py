"""The schedule simulator (trainplan.pipeline.simulate): hand-computed step times for GPipe and 1F1B orders (as
torch.distributed.pipelining's schedules run them at k = 2: the pipeline-run tests check the recorded ones), two
stages on one rank, the transfer model, in-flight counts, and refusals."""

from __future__ import annotations

import pytest

from trainplan.pipeline.errors import PipelineError
from trainplan.pipeline.simulate import StageCosts, held_in_flight, recorded_orders, simulate


def orders(schedule: str, k: int, m: int) -> list[list[tuple[str, int, int]]]:
    """GPipe: every forward, then every backward. 1F1B: stage s runs k - 1 - s forwards, then alternates one
    forward and one backward, then the remaining backwards. Stage s on rank s."""
    if schedule == "gpipe":
        return [[("F", s, i) for i in range(m)] + [("B", s, i) for i in range(m)] for s in range(k)]
    out = []
    for s in range(k):
        warm = min(k - 1 - s, m)
        actions = [("F", s, i) for i in range(warm)]
        for i in range(m - warm):
            actions += [("F", s, warm + i), ("B", s, i)]
        out.append(actions + [("B", s, i) for i in range(m - warm, m)])
    return out


def test_recorded_orders_are_read_in_order():
    timeline = [[{"kind": "F", "stage": 0, "micro_batch": 0}, {"kind": "B", "stage": 0, "micro_batch": 0}]]
    assert recorded_orders(timeline) == [[("F", 0, 0), ("B", 0, 0)]]
    assert [(kind, i) for kind, _, i in orders("1f1b", 2, 4)[0]] == [
        ("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("k", "m"), [(2, 4), (3, 6), (4, 8)])
def test_equal_stages_without_transfers_give_the_bubble_formula(schedule, k, m):
    f, b = 1.0, 2.0
    costs = StageCosts([f] * k, [b] * k, [0.0] * (k - 1), [0.0] * (k - 1))
    assert simulate(orders(schedule, k, m), costs)["step_time_s"] == pytest.approx((m + k - 1) * (f + b))


def test_gpipe_two_stages_by_hand():
    # stage 0: F 1, B 3; stage 1: F 2, B 1; forward carrier 0.5, gradient back 0.25; m = 2
    costs = StageCosts([1.0, 2.0], [3.0, 1.0], [0.5], [0.25])
    out = simulate(orders("gpipe", 2, 2), costs)
    # rank 0: F0 0-1 (+0.5 send), F1 1.5-2.5 (+0.5); rank 1: F0 1.5-3.5, F1 3.5-5.5, B0 5.5-6.5 (+0.25),
    # B1 6.75-7.75 (+0.25); rank 0: B0 max(3, 6.75) = 6.75-9.75, B1 max(9.75, 8.0) -> 12.75
    assert [(a["start_s"], a["end_s"]) for a in out["timeline"][0]] == [(0, 1), (1.5, 2.5), (6.75, 9.75),
                                                                          (9.75, 12.75)]
    assert [(a["start_s"], a["end_s"]) for a in out["timeline"][1]] == [(1.5, 3.5), (3.5, 5.5), (5.5, 6.5),
                                                                          (6.75, 7.75)]
    assert out["step_time_s"] == pytest.approx(12.75)


def test_an_order_that_deadlocks_and_mismatched_costs_are_refused():
    costs = StageCosts([1.0, 1.0], [1.0, 1.0], [0.0], [0.0])
    with pytest.raises(PipelineError, match="deadlock"):
        simulate([[("B", 0, 0), ("F", 0, 0)], [("F", 1, 0), ("B", 1, 0)]], costs)
    with pytest.raises(PipelineError, match="run stages \\[0\\], the costs are for 2 stages"):
        simulate([[("F", 0, 0), ("B", 0, 0)]], costs)
    with pytest.raises(PipelineError, match="k - 1 transfers"):
        StageCosts([1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0])


def test_two_stages_on_each_rank_by_hand():
    """k = 4 on 2 ranks (stage s on rank s mod 2), m = 2, every action 1 s, transfers 0.5 s (the sender busy for it);
    each rank runs the order Interleaved1F1B ran for tiny GPT-2 at m = 2: stage s's forwards, then stage s + 2's."""
    costs = StageCosts([1.0] * 4, [1.0] * 4, [0.5] * 3, [0.5] * 3)
    rank0 = [("F", 0, 0), ("F", 0, 1), ("F", 2, 0), ("F", 2, 1), ("B", 2, 0), ("B", 2, 1), ("B", 0, 0), ("B", 0, 1)]
    rank1 = [("F", 1, 0), ("F", 1, 1), ("F", 3, 0), ("B", 3, 0), ("F", 3, 1), ("B", 3, 1), ("B", 1, 0), ("B", 1, 1)]
    out = simulate([rank0, rank1], costs)
    # rank 0: F00 0-1 (+.5 send), F01 1.5-2.5 (+.5); rank 1: F10 1.5-2.5 (+.5), F11 3-4 (+.5); rank 0: F20 3-4
    # (+.5), F21 4.5-5.5 (+.5); rank 1: F30 4.5-5.5, B30 5.5-6.5 (+.5), F31 7-8, B31 8-9 (+.5); rank 0: B20 7-8
    # (+.5), B21 9.5-10.5 (+.5); rank 1: B10 9.5-10.5 (+.5), B11 11-12 (+.5); rank 0: B00 11-12, B01 12.5-13.5
    assert [(a["stage"], a["start_s"], a["end_s"]) for a in out["timeline"][0]] == [
        (0, 0, 1), (0, 1.5, 2.5), (2, 3, 4), (2, 4.5, 5.5), (2, 7, 8), (2, 9.5, 10.5), (0, 11, 12), (0, 12.5, 13.5)]
    assert [(a["stage"], a["start_s"], a["end_s"]) for a in out["timeline"][1]] == [
        (1, 1.5, 2.5), (1, 3, 4), (3, 4.5, 5.5), (3, 5.5, 6.5), (3, 7, 8), (3, 8, 9), (1, 9.5, 10.5), (1, 11, 12)]
    assert out["step_time_s"] == 13.5 and out["rank_end_s"] == [13.5, 12.5]
    assert held_in_flight([rank0, rank1], 4) == [2, 2, 2, 1]  # stage 3 runs each backward right after its forward


@pytest.mark.parametrize(("k", "m"), [(2, 4), (4, 8)])
def test_in_flight_counts_of_the_single_stage_schedules(k, m):
    assert held_in_flight(orders("gpipe", k, m), k) == [m] * k
    assert held_in_flight(orders("1f1b", k, m), k) == [min(k - s, m) for s in range(k)]
