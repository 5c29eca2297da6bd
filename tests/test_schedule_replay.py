"""The replay checker: exact time/peak and every kind of violation."""

import pytest

from trainplan.schedule import ScheduleError, problem_from_dict, replay
from trainplan.schedule.replay import take_outputs_at_once

PROBLEM = problem_from_dict({
    "ops": [
        {"id": "x", "time": 1.0, "bytes": 10, "inputs": []},
        {"id": "a", "time": 2.0, "bytes": 20, "inputs": ["x"], "workspace": 5},
        {"id": "b", "time": 4.0, "bytes": 30, "inputs": ["a"], "recompute": False},
        {"id": "c", "time": 8.0, "bytes": 40, "inputs": ["b", "x"], "swap": False},
    ],
    "fixed_bytes": 3, "budget_bytes": 1000, "bandwidth": 10.0, "keep": ["c"],
})

VALID = [("compute", "x"), ("swap_out", "x"), ("free", "x"), ("swap_in", "x"), ("compute", "a"),
         ("free", "x"), ("compute", "b"), ("free", "a"), ("compute", "x"), ("compute", "c"),
         ("free", "x"), ("free", "b")]


def test_valid_events_give_exact_time_and_peak():
    rep = replay(PROBLEM, VALID)
    # computes 1+2+4+1+8, transfers of x (10 B at 10 B/s) out and in
    assert rep.time == 16.0 + 2.0
    # compute c: fixed 3 + resident b 30 + x 10 + c 40
    assert rep.peak_bytes == 83
    assert (rep.recomputes, rep.swap_ins, rep.swap_outs) == (1, 1, 1)
    assert replay(PROBLEM, VALID, budget_bytes=83).peak_bytes == 83


def test_workspace_counts_during_compute_only():
    p = problem_from_dict({"ops": [{"id": "x", "time": 1, "bytes": 10, "inputs": []},
                                   {"id": "a", "time": 1, "bytes": 20, "inputs": ["x"], "workspace": 50}],
                           "budget_bytes": 100, "bandwidth": 1, "keep": ["a"]})
    events = [("compute", "x"), ("compute", "a"), ("free", "x")]
    assert replay(p, events).peak_bytes == 80
    with pytest.raises(ScheduleError, match="event 1 compute 'a': device bytes 80 exceed budget 79"):
        replay(p, events, budget_bytes=79)


@pytest.mark.parametrize(
    "events, message",
    [
        ([("compute", "a")], "input(s) ['x'] not resident"),
        ([("compute", "x"), ("compute", "x")], "already resident"),
        ([("compute", "x"), ("free", "x"), ("swap_in", "x")], "no host copy"),
        ([("compute", "x"), ("swap_out", "x"), ("swap_in", "x")], "already resident"),
        ([("free", "x")], "not resident"),
        (VALID + [("free", "c")], "keep op(s) not resident at the end: ['c']"),
        (VALID[:6], "never computed"),
        ([("compute", "x"), ("compute", "a"), ("compute", "b"), ("free", "b"), ("compute", "b")],
         "recompute=false"),
        ([("compute", "x"), ("compute", "a"), ("compute", "b"), ("compute", "c"), ("swap_out", "c")],
         "swap=false"),
        ([("launch", "x")], "unknown kind"),
        ([("compute", "zz")], "unknown op"),
        (["compute"], "expected [kind, op]"),
    ],
)
def test_violations_are_caught(events, message):
    with pytest.raises(ScheduleError) as err:
        replay(PROBLEM, events)
    assert message in str(err.value)


def test_over_budget_is_caught():
    with pytest.raises(ScheduleError, match="exceed budget 82"):
        replay(PROBLEM, VALID, budget_bytes=82)


def test_host_copy_survives_swap_in():
    events = [("compute", "x"), ("swap_out", "x"), ("free", "x"), ("swap_in", "x"), ("free", "x"),
              ("swap_in", "x"), ("compute", "a"), ("compute", "b"), ("compute", "c")]
    assert replay(PROBLEM, events).swap_ins == 2


OUTPUTS = problem_from_dict({
    "ops": [{"id": "x", "time": 1, "bytes": 10, "inputs": []},
            {"id": "z", "time": 1, "bytes": 8, "inputs": []},
            {"id": "k", "time": 1, "bytes": 20, "inputs": ["x"], "workspace": 7},
            {"id": "k#1", "time": 0, "bytes": 3, "inputs": ["k", "x"], "recompute": False, "of": "k"},
            {"id": "k#2", "time": 0, "bytes": 4, "inputs": ["k", "x"], "recompute": False, "of": "k"},
            {"id": "y", "time": 1, "bytes": 5, "inputs": ["k", "k#2", "z"]}],
    "budget_bytes": 1000, "bandwidth": 1.0, "keep": ["y"]})


def test_a_kernels_further_outputs_are_taken_at_once():
    late = [("compute", "x"), ("compute", "z"), ("swap_out", "z"), ("free", "z"), ("compute", "k"),
            ("swap_in", "z"), ("compute", "k#1"), ("compute", "k#2"), ("free", "k#1"), ("compute", "y")]
    with pytest.raises(ScheduleError, match="event 5 swap_in 'z': 'k#1', a further output of 'k', must be computed"):
        replay(OUTPUTS, late)
    at_once = take_outputs_at_once(OUTPUTS, late)
    assert at_once[4:8] == [("compute", "k"), ("compute", "k#1"), ("compute", "k#2"), ("swap_in", "z")]
    # y (5) runs beside x 10, k 20, k#2 4 and z 8
    assert replay(OUTPUTS, at_once).peak_bytes == 47
    assert take_outputs_at_once(OUTPUTS, at_once) == at_once
    # frees between them are harmless (it adds nothing); taking one alone later is not
    replay(OUTPUTS, [("compute", "x"), ("compute", "z"), ("compute", "k"), ("compute", "k#2"), ("compute", "k#1"),
                     ("compute", "y")])
    with pytest.raises(ScheduleError, match="'k#2', a further output of 'k', is never taken"):
        replay(OUTPUTS, [("compute", "x"), ("compute", "k"), ("compute", "k#1")])
    with pytest.raises(ScheduleError, match="event 1 compute 'k#1': a further output of 'k' is computed only right"):
        replay(OUTPUTS, [("compute", "x"), ("compute", "k#1")])
