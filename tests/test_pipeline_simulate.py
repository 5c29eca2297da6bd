"""The schedule simulator (trainplan.pipeline.simulate): hand-computed step times for GPipe and 1F1B orders (as
torch.distributed.pipelining's schedules run them at k = 2: the pipeline-run tests check the recorded ones), the
transfer model, and refusals."""

from __future__ import annotations

import pytest

from trainplan.pipeline.errors import PipelineError
from trainplan.pipeline.simulate import StageCosts, recorded_orders, simulate


def orders(schedule: str, k: int, m: int) -> list[list[tuple[str, int]]]:
    """GPipe: every forward, then every backward. 1F1B: stage s runs k - 1 - s forwards, then alternates one
    forward and one backward, then the remaining backwards."""
    if schedule == "gpipe":
        return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(k)]
    out = []
    for s in range(k):
        warm = min(k - 1 - s, m)
        actions = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            actions += [("F", warm + i), ("B", i)]
        out.append(actions + [("B", i) for i in range(m - warm, m)])
    return out


def test_recorded_orders_are_read_in_order():
    timeline = [[{"kind": "F", "micro_batch": 0}, {"kind": "B", "micro_batch": 0}]]
    assert recorded_orders(timeline) == [[("F", 0), ("B", 0)]]
    assert orders("1f1b", 2, 4)[0] == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]


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
        simulate([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]], costs)
    with pytest.raises(PipelineError, match="k - 1 transfers"):
        StageCosts([1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0])
