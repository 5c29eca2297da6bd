"""Balance rates and pipeline formulas, the re-partition loop on a small graph, artifact round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_partition_graph import training_graph

from trainplan.partition import (
    BalanceSettings,
    MemoryLimit,
    PartitionError,
    SolverSettings,
    StageScheduler,
    balance,
    iterations_dict,
    partition_from_dict,
    partition_graph,
    pipeline_graph,
    pipeline_metrics,
    plan_dict,
    range_tables,
    stage_stats,
)
from trainplan.budget import Budget, BudgetError
from trainplan.partition.balance import scaled_weights
from trainplan.schedule import problem_from_dict, replay
from trainplan.schedule.pipeline_hold import PipelineHold, gradient_sum_bytes, others_held, stash_bytes

SOLVER = SolverSettings(time_limit_s=0.5, workers=1, seed=0)
# where two runs must agree: a limit whose wall-clock shares (the greedy variants' 30%) no load reaches
STEADY = SolverSettings(time_limit_s=5.0, workers=1, seed=0)


def test_pipeline_metrics_formulas():
    m = pipeline_metrics([2.0, 4.0, 1.0], peaks=[100, 200, 300], stash_bytes=[10, 20, 30], micro_batches=2)
    assert (m.t_max_s, m.t_min_s, m.bottleneck_stage) == (4.0, 1.0, 1)
    assert m.rate == 0.25 and m.spread == 0.75
    assert m.gpipe_step_time_s == (2 + 3 - 1) * 4.0
    # in flight: min(k - s, m) = 2, 2, 1 micro-batches: one runs, the others' stashes wait
    assert m.rank_peak_bytes == [110, 220, 300]
    assert pipeline_metrics([3.0], [5], [7], 8).rank_peak_bytes == [5]  # one stage: nothing else in flight
    # gradients summed across micro-batches are held on top (m > 1 only)
    sums = [1000, 2000, 3000]
    assert pipeline_metrics([2.0, 4.0, 1.0], [100, 200, 300], [10, 20, 30], 2, sums).rank_peak_bytes == [
        1110, 2220, 3300]
    assert pipeline_metrics([2.0, 4.0, 1.0], [100, 200, 300], [10, 20, 30], 1, sums).rank_peak_bytes == [
        100, 200, 300]


@pytest.fixture(scope="module")
def small():
    nodes, tensors = training_graph(12, seed=4, skip_prob=0.3)
    g = pipeline_graph(nodes, tensors)
    return nodes, tensors, g, range_tables(g)


def scheduler(nodes, tensors, fraction=0.5, solver=SOLVER) -> StageScheduler:
    return StageScheduler(nodes, tensors, bandwidth=1e6, budget=fraction, solver=solver)


@pytest.mark.parametrize("fraction", [0.0, 1.5])
def test_budget_fraction_out_of_range(small, fraction):
    nodes, tensors, _, _ = small
    with pytest.raises(BudgetError, match=rf"budget {fraction}: a fraction must be in \(0, 1\]"):
        scheduler(nodes, tensors, fraction)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_balance_loop_records_consistent_numbers(small, schedule):
    nodes, tensors, g, t = small
    settings = BalanceSettings(threshold=0.999, max_iterations=3, micro_batches=4, tolerance=0.02, schedule=schedule)
    memory = MemoryLimit(2**40, settings.micro_batches, schedule)
    first = partition_graph(g, t, 3, tolerance=settings.tolerance, memory=memory)
    sched = StageScheduler(nodes, tensors, bandwidth=1e6, budget=0.5, solver=SOLVER,
                           pipeline=PipelineHold(3, settings.micro_batches, schedule))
    result = balance(g, t, first, sched, settings, memory)
    assert 1 <= len(result.iterations) <= settings.max_iterations
    assert result.iterations[0].cuts == first.cuts
    t_max = [it.metrics.t_max_s for it in result.iterations]
    assert result.final.metrics.t_max_s == min(t_max)
    for it in result.iterations:
        times = it.times
        assert it.metrics.rate == pytest.approx(min(times) / max(times))
        assert it.metrics.spread == pytest.approx((max(times) - min(times)) / max(times))
    # a stop reason that matches the numbers
    rates = [it.metrics.rate for it in result.iterations]
    if "threshold" in result.stop_reason:
        assert rates[-1] >= settings.threshold
    elif "stopped improving" in result.stop_reason:
        assert rates[-1] <= rates[-2]
    plan = plan_dict(g, result, settings, memory)
    assert plan["balance"]["rate"] == result.final.metrics.rate
    assert plan["balance"]["schedule"] == schedule
    assert sorted(n for s in plan["stages"] for n in s["nodes"]) == sorted(nodes.name)
    for stage in plan["stages"]:
        problem = problem_from_dict(stage["problem"])
        assert problem.budget_bytes == stage["problem"]["budget_bytes"] >= 0
        events = [tuple(e) for e in stage["schedule"]["events"]]
        assert replay(problem, events, stage["schedule"]["budget_bytes"]).time == pytest.approx(stage["time_s"])
        # the rank holds its gradient sums and the other in-flight micro-batches' stashes: within its budget
        hold = stage["problem"]["pipeline"]
        # 1F1B: min(k - s, m) micro-batches in flight; GPipe: every forward before the first backward, all m
        assert stage["in_flight"] == hold["in_flight"] == (min(3 - stage["index"], 4) if schedule == "1f1b" else 4)
        assert hold["schedule"] == schedule
        assert stage["gradient_sum_bytes"] == hold["gradient_sum_bytes"] == gradient_sum_bytes(stage["problem"])
        assert stage["stash_bytes"] == stash_bytes(stage["problem"], events)
        assert stage["carrier_bytes"] == hold["carrier_bytes"]
        assert stage["rank_peak_bytes"] == stage["peak_bytes"] + stage["gradient_sum_bytes"] + (
            stage["carrier_bytes"] + others_held(stage["in_flight"], stage["stash_bytes"],
                                                 hold["pending_gradient_sends"], hold["carrier_in_bytes"]))
        assert stage["rank_peak_bytes"] <= stage["rank_budget_bytes"]
        assert stage["problem"]["budget_bytes"] == max(0, hold["rank_budget_bytes"] - hold["reserve_bytes"])
        met = stage["rank_peak_bytes"] <= hold["rank_budget_bytes"]
        assert stage["rank_status"] == ("met" if met else "raised")
        assert stage["rank_budget_bytes"] == (hold["rank_budget_bytes"] if met else stage["rank_peak_bytes"])
    cmp = plan["balance"]["dp_comparison"]
    assert cmp["bottleneck_ratio"] == pytest.approx(result.final.metrics.t_max_s / result.dp.metrics.t_max_s)
    assert cmp["dp"]["profiled_bottleneck_s"] <= cmp["ours_profiled_bottleneck_s"] * (1 + 1e-12)
    json.dumps(plan)
    assert len(iterations_dict(result)["iterations"]) == len(result.iterations)
    assert sched.solved <= 3 * (len(result.iterations) + 1)  # identical stages are solved once


def test_scaled_weights_apply_each_stages_overhead(small):
    nodes, tensors, g, t = small
    first = partition_graph(g, t, 2, tolerance=0.0)
    settings = BalanceSettings(threshold=0.0, max_iterations=1, micro_batches=2, tolerance=0.0)
    result = balance(g, t, first, scheduler(nodes, tensors, 0.3), settings)
    it = result.iterations[0]
    w = scaled_weights(g, it)
    for stage, time in zip(it.stages, it.times):
        mine = np.isin(np.array(g.names), stage.nodes)
        assert w[mine].sum() == pytest.approx(time)


def test_partition_round_trip_and_stale_artifact(small):
    nodes, tensors, g, t = small
    part = partition_graph(g, t, 3, tolerance=0.05)
    data = json.loads(json.dumps(part.to_dict()))
    back = partition_from_dict(g, data)
    assert back.cuts == part.cuts and back.split_cuts == part.split_cuts and back.stages == part.stages
    other = partition_graph(g, t, 3, tolerance=0.05, weights=g.time[::-1].copy())
    data["stages"][0]["nodes"] = other.stages[0].nodes if other.cuts != part.cuts else ["x"]
    with pytest.raises(PartitionError, match="stage 0 of the partition does not match the graph"):
        partition_from_dict(g, data)
    data["cuts"] = [0, 5, 5, g.n_forward]
    with pytest.raises(PartitionError, match="are not increasing"):
        partition_from_dict(g, data)


def test_a_stage_without_any_schedule_is_named(small, monkeypatch):
    from trainplan.schedule import budgeted_stages
    from trainplan.schedule.schedule_io import no_schedule

    nodes, tensors, g, t = small
    monkeypatch.setattr(budgeted_stages, "solve_stage", lambda raw, *a: no_schedule(
        raw["budget_bytes"], "ours", 0.0, "proven infeasible"))
    part = partition_graph(g, t, 2, tolerance=0.0)
    with pytest.raises(PartitionError, match=r"stage 0 \(\d+ nodes, first 'f1'\): no schedule meets budget "
                                             r"\d+ B \(requested: 0.5 of the no-recompute peak\): proven infeasible"):
        balance(g, t, part, scheduler(nodes, tensors), BalanceSettings(0.9, 2, 2, 0.0))


def _timeless(value):
    """``value`` without wall-clock entries (keys ending in 'seconds'), which differ from run to run."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if not k.endswith("seconds")}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


@pytest.fixture(scope="module")
def rule_schedules(small, tmp_path_factory):
    """The schedule rule's path: every stage of the first partition solved by every method, written to
    schedules.json as the rule writes it."""
    from trainplan.io import write_json
    from trainplan.schedule.budgeted_stages import StageBudget, schedule_stages, stage_schedules_dict

    nodes, tensors, g, t = small
    part = partition_graph(g, t, 2, tolerance=0.0)
    stage_nodes = [s.nodes for s in stage_stats(g, part.cuts)]
    solved = schedule_stages(nodes, tensors, stage_nodes, budget=StageBudget(Budget(fraction=0.5), 1e6), solver=STEADY,
                             progress=False)
    path = tmp_path_factory.mktemp("schedule") / "schedules.json"
    write_json(path, stage_schedules_dict({"model": "small", "k": 2, "budget_fraction": 0.5}, solved))
    return part, stage_nodes, solved, path


def test_balance_takes_iteration_0_from_the_schedule_rule_with_the_same_plan(small, rule_schedules, monkeypatch):
    """Balance reuses the schedule rule's schedules (read back and replay-checked), solves none of them
    again, and the plan is the one it gets by solving every stage itself."""
    from trainplan.partition import schedule_cache
    from trainplan.schedule import budgeted_stages
    from trainplan.schedule.budgeted_stages import read_stage_schedules

    nodes, tensors, g, t = small
    part, stage_nodes, solved, path = rule_schedules
    settings = BalanceSettings(threshold=0.0, max_iterations=1, micro_batches=2, tolerance=0.0)
    fresh = plan_dict(g, balance(g, t, part, scheduler(nodes, tensors, solver=STEADY), settings), settings, None)
    reused = scheduler(nodes, tensors, solver=STEADY)
    for res in read_stage_schedules(path, stage_nodes):
        reused.reuse(res.index, res.nodes, res.problem, res.ours)
    real = budgeted_stages.schedule_stage
    solved_here = []

    def recorded(nodes, tensors, stage_nodes, **kwargs):  # the DP partition's stages may differ from iteration 0's
        solved_here.append(tuple(stage_nodes))
        return real(nodes, tensors, stage_nodes, **kwargs)

    monkeypatch.setattr(schedule_cache, "schedule_stage", recorded)
    plan = plan_dict(g, balance(g, t, part, reused, settings), settings, None)
    assert reused.reused == 2 and not set(solved_here) & set(map(tuple, stage_nodes))
    assert _timeless(plan) == _timeless(fresh)
    for res, stage in zip(solved, plan["stages"]):
        assert stage["schedule"]["events"] == [list(e) for e in res.ours.events]


def test_a_damaged_or_foreign_schedules_file_is_named(small, rule_schedules, tmp_path):
    from trainplan.errors import ArtifactError
    from trainplan.schedule.budgeted_stages import read_stage_schedules

    _, stage_nodes, _, path = rule_schedules
    data = json.loads(path.read_text())
    with pytest.raises(ArtifactError, match="artifact not found: .*gone.json"):
        read_stage_schedules(tmp_path / "gone.json", stage_nodes)
    cut = tmp_path / "cut.json"
    cut.write_text(path.read_text()[: len(path.read_text()) // 2])
    with pytest.raises(ArtifactError, match=f"corrupt JSON artifact {cut}"):
        read_stage_schedules(cut, stage_nodes)

    def altered(change, name):
        bad = json.loads(json.dumps(data))
        change(bad)
        out = tmp_path / name
        out.write_text(json.dumps(bad))
        return out

    def drop_event(d):
        del d["stages"][1]["schedule"]["events"][0]

    def halve_time(d):
        d["stages"][0]["methods"]["sqrt_checkpoint"]["time"] /= 2

    cases = [(drop_event, r"stage 1: event 0 \w+ '.*': op is not resident"),
             (halve_time, r"stage 0: schedule \(sqrt_checkpoint\) states time"),
             (lambda d: d["stages"].pop(), r"1 stage\(s\), but the partition has 2"),
             (lambda d: d["stages"][0]["problem"]["ops"][0].pop("bytes"), r"stage 0: op '.*' missing key 'bytes'"),
             (lambda d: d["stages"][1].pop("schedule"), r"stage 1: missing key 'schedule'")]
    for i, (change, message) in enumerate(cases):
        bad = altered(change, f"bad{i}.json")
        with pytest.raises(ArtifactError, match=f"{bad}: {message}"):
            read_stage_schedules(bad, stage_nodes)
    swapped = altered(lambda d: d["stages"].reverse(), "swapped.json")
    with pytest.raises(ArtifactError, match="stage 0: index 1 at position 0"):
        read_stage_schedules(swapped, stage_nodes)
    with pytest.raises(ArtifactError, match="stage 0: its nodes are not the partition's stage"):
        read_stage_schedules(path, stage_nodes[::-1])
