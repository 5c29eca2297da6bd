"""Every method's schedule replays valid with the reported numbers; ours is never worse."""

import time
from dataclasses import replace

import pytest

from trainplan.io import read_json
from trainplan.schedule import SolveOptions, compare, problem_from_dict, replay, save_schedule, solve
from trainplan.schedule import checkmate as checkmate_module
from trainplan.schedule import checkmate_lp
from trainplan.schedule.baselines import no_recompute_events, sqrt_checkpoint, swap_only
from trainplan.schedule.checkmate_lp import THRESHOLDS
from trainplan.schedule.schedule_io import NO_SCHEDULE_STATUSES
from trainplan.schedule.settings import DEFAULTS
from trainplan.schedule.synthetic import training_graph

GRAPH = training_graph(40, 7)
NR_PEAK = replay(GRAPH, no_recompute_events(GRAPH)).peak_bytes


def at(fraction: float):
    return GRAPH.with_budget(GRAPH.fixed_bytes + int((NR_PEAK - GRAPH.fixed_bytes) * fraction))


@pytest.fixture(scope="module")
def results():
    return {f: compare(at(f), time_limit_s=2, workers=2, seed=0) for f in (1.0, 0.6)}


def test_every_schedule_replays_to_its_numbers(results):
    for frac, by_method in results.items():
        for name, s in by_method.items():
            assert s.method == name
            if not s.events:
                assert s.status in NO_SCHEDULE_STATUSES and s.time is None
                continue
            rep = replay(GRAPH, s.events)
            assert (rep.time, rep.peak_bytes) == (s.time, s.peak_bytes), name
            assert s.ok == (rep.peak_bytes <= s.budget_bytes), name
            assert (s.status == "over_budget") == s.extra.get("over_budget", False) == (not s.ok), name
            if s.ok:
                assert s.bound <= s.time and s.gap == pytest.approx((s.time - s.bound) / s.time)


def test_ours_no_worse_than_any_baseline(results):
    for by_method in results.values():
        ours = by_method["ours"]
        assert ours.ok
        for name, s in by_method.items():
            if s.ok:
                assert ours.time <= s.time * (1 + 1e-12), name


def test_no_recompute_is_optimal_at_its_own_peak_and_over_budget_below(results):
    full, tight = results[1.0], results[0.6]
    assert full["no_recompute"].status == "optimal" and full["ours"].status == "optimal"
    assert full["no_recompute"].peak_bytes == NR_PEAK
    over = tight["no_recompute"]  # reported at its own peak, with its time, flagged
    assert over.status == "over_budget" and over.extra["over_budget"] and over.peak_bytes == NR_PEAK
    assert over.time == full["no_recompute"].time
    assert tight["ours"].time > full["ours"].time
    assert tight["ours"].extra["recomputes"] + tight["ours"].extra["swap_ins"] > 0


def test_sqrt_checkpoint_recomputes_and_saves_memory(results):
    s = results[1.0]["sqrt_checkpoint"]
    assert s.extra["recomputes"] > 0 and s.peak_bytes < NR_PEAK


def test_swap_only_never_recomputes(results):
    s = results[0.6]["swap_only"]
    assert s.ok and s.extra["recomputes"] == 0 and s.extra["swap_ins"] > 0


def test_checkmate_recompute_only():
    s = checkmate_module.checkmate(at(0.6), time_limit_s=5, workers=2, seed=0)
    assert s.extra["variant"] == "milp" and s.extra["milp_status"] in ("OPTIMAL", "FEASIBLE")
    assert s.extra["swap_ins"] == 0 and s.extra["recomputes"] > 0


def test_checkmate_lp_rounding_where_the_milp_is_not_built(monkeypatch):
    """Above the MILP's size the LP relaxation is rounded: statuses say what is known (the MILP NOT_BUILT is
    not 'infeasible'), the schedule replays to its numbers, and the call keeps its time limit."""
    monkeypatch.setattr(checkmate_module, "MAX_VARIABLES", 10)
    t0 = time.perf_counter()
    s = checkmate_module.checkmate(at(0.6), time_limit_s=4, seed=0)
    assert time.perf_counter() - t0 <= 4 * 1.05
    assert s.extra["milp_status"] == "NOT_BUILT" and s.extra["variant"] == "lp_rounding"
    assert s.extra["lp_status"] == "OPTIMAL" and s.extra["rounding"]["rounds"] >= len(THRESHOLDS)
    assert s.status in ("feasible", "over_budget") and s.events
    rep = replay(GRAPH, s.events)
    assert (rep.time, rep.peak_bytes, rep.swap_ins) == (s.time, s.peak_bytes, 0)
    assert (s.status == "over_budget") == (rep.peak_bytes > s.budget_bytes)


def test_checkmate_statuses_when_nothing_is_found(monkeypatch):
    monkeypatch.setattr(checkmate_module, "MAX_VARIABLES", 10)
    monkeypatch.setattr(checkmate_lp, "BUILD_SHARE", 0.0)  # the LP's build deadline passes at once
    s = checkmate_module.checkmate(at(0.6), time_limit_s=1)
    assert s.status == "not_built" and s.events == [] and s.extra["lp_status"] == "NOT_BUILT"
    assert "not built" in s.extra["note"] and s.extra["milp_status"] == "NOT_BUILT"
    p = GRAPH.with_budget(GRAPH.fixed_bytes - 1)  # proven: the fixed bytes alone exceed the budget
    assert checkmate_module.checkmate(p, time_limit_s=1).status == "infeasible"


@pytest.mark.parametrize("seed", range(4))
def test_lp_rounding_is_valid_and_never_below_the_milp_optimum(seed):
    """Small recompute-only graphs: the MILP proves its optimum; every rounding that fits costs at least as
    much (the rounding is a recompute-only schedule with first computes in program order, as the MILP's)."""
    g = training_graph(16, seed)
    nr = replay(g, no_recompute_events(g)).peak_bytes
    p = g.with_budget(g.fixed_bytes + int(0.85 * (nr - g.fixed_bytes)))
    milp = checkmate_module.checkmate(p, time_limit_s=10, workers=1)
    assert milp.extra["milp_status"] == "OPTIMAL"
    lp = checkmate_lp.checkmate_lp(p, time_limit_s=5, seed=seed)
    assert lp.extra["lp_status"] == "OPTIMAL" and lp.events
    rep = replay(p, lp.events)
    assert (rep.time, rep.peak_bytes) == (lp.time, lp.peak_bytes)
    assert lp.ok and lp.extra["rounding"]["within_budget"] >= 1
    assert lp.time >= milp.time * (1 - 1e-9)


def test_over_budget_baselines_keep_their_time_and_peak():
    """sqrt(n) and swap-only that cannot meet a budget report their own peak and time, flagged."""
    tight = GRAPH.with_budget(GRAPH.floor_bytes)
    sq = sqrt_checkpoint(tight)
    assert sq.status == "over_budget" and sq.extra["over_budget"] and sq.time > 0
    assert sq.peak_bytes == replay(GRAPH, sq.events).peak_bytes > tight.budget_bytes
    no_swap = problem_from_dict({**tight.to_dict(), "ops": [
        {**op, "swap": op["id"] != "f3"} for op in tight.to_dict()["ops"]]})
    sw = swap_only(no_swap)
    rep = replay(no_swap, sw.events)
    assert sw.status == "over_budget" and rep.peak_bytes == sw.peak_bytes > no_swap.budget_bytes
    assert rep.recomputes == 0 and "least budget it met" in sw.extra["note"]
    assert swap_only(no_swap.with_budget(sw.peak_bytes)).ok  # the greedy meets its own peak


def test_schedule_file_round_trip(tmp_path):
    s = solve(at(0.6), time_limit_s=2, workers=1, seed=0)
    save_schedule(tmp_path / "s.json", s)
    data = read_json(tmp_path / "s.json")
    for key in ("status", "events", "time", "peak_bytes", "budget_bytes", "bound", "gap", "solve_seconds", "method"):
        assert key in data
    rep = replay(GRAPH, data["events"], data["budget_bytes"])
    assert (rep.time, rep.peak_bytes) == (data["time"], data["peak_bytes"])


def test_sqrt_checkpoint_keeps_what_it_could_not_rebuild():
    """'a' is read again two segments later; rebuilding it needs 'x' (recompute=false), which is dead by
    then, so 'a' must stay resident. Every other interior tensor is dropped and recomputed as usual."""
    ops = [{"id": "x", "time": 1.0, "bytes": 10, "inputs": [], "recompute": False},
           {"id": "a", "time": 1.0, "bytes": 10, "inputs": ["x"]},
           {"id": "c", "time": 1.0, "bytes": 10, "inputs": ["a"]},
           {"id": "d", "time": 1.0, "bytes": 10, "inputs": ["c"]},
           {"id": "e", "time": 1.0, "bytes": 10, "inputs": ["d"]},
           {"id": "f", "time": 1.0, "bytes": 10, "inputs": ["e"]},
           {"id": "g", "time": 1.0, "bytes": 10, "inputs": ["f", "a", "d", "c"]},
           {"id": "h", "time": 1.0, "bytes": 10, "inputs": ["g"]},
           {"id": "i", "time": 1.0, "bytes": 10, "inputs": ["h"]}]
    p = problem_from_dict({"ops": ops, "budget_bytes": 1000, "bandwidth": 1.0, "keep": ["i"]})
    s = sqrt_checkpoint(p)
    assert s.ok and s.events, s.extra.get("note")
    assert replay(p, s.events).time == s.time
    computes = [o for k, o in s.events if k == "compute"]
    assert computes.count("a") == 1  # kept: its rebuild would need the dead 'x'
    assert computes.count("d") == 2  # dropped at the segment end, recomputed from checkpoint 'c' (live until g)


def test_reported_bound_is_the_relaxation_bound_not_cp_sats(wide_wall_nets):
    """At 80%, without the staged bound, CP-SAT proves its model optimal with a bound above the relaxation's;
    that bound holds only within the model (C copies, K slots), so the reported one is the relaxation's, the
    gap stays open and the schedule is only feasible (optimal within the model, as the extra says)."""
    no_staged = replace(DEFAULTS, staged_variables_per_second=0)
    options = SolveOptions(bisect=False, settings=wide_wall_nets(no_staged))
    s = solve(at(0.8), time_limit_s=3, workers=1, seed=0, options=options)
    mip_bound, relax = s.extra["mip"]["bound"], s.extra["relaxation"]["bound"]
    assert s.extra["mip"]["status"] == "OPTIMAL" and mip_bound > relax * (1 + 1e-6)
    assert s.status == "feasible" and s.bound == max(relax, GRAPH.compute_time) and s.gap > 1e-9
    assert "copies per op" in s.extra["optimal_within"]


def test_staged_bound_proves_what_cp_sat_proved_only_within_its_model(wide_wall_nets):
    """The same case with the staged bound on: it meets the schedule, which is then optimal among all
    schedules (not only within CP-SAT's model), and the full model is not built."""
    s = solve(at(0.8), time_limit_s=3, workers=1, seed=0, options=SolveOptions(bisect=False, settings=wide_wall_nets()))
    relax, staged = s.extra["relaxation"]["bound"], s.extra["staged_bound"]["bound"]
    assert s.extra["staged_bound"]["status"] == "OPTIMAL" and staged > relax * (1 + 1e-6)
    assert s.status == "optimal" and "optimal_within" not in s.extra and s.extra["mip"]["status"] == "SKIPPED"
    events = s.extra["recomputes"] + s.extra["swap_ins"] + s.extra["swap_outs"]
    assert s.bound == staged <= s.time <= staged + events * 1e-9
