"""trainplan pipeline-run: a k=2 balance plan of tiny GPT-2 run as two torchrun processes under GPipe and 1F1B, and a
k=3 one whose stage 1 relays what stages 0 and 2 exchange, with losses and gradients equal to the single-process
planned step's (the tied embedding's within round-off when its partial gradient is reduced once per step); the
run's medians and prediction with send/recv; bad input refused by name."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import TINY_GPT2
from tests.test_loss_head import TINY_LLAMA
from trainplan.budget import Budget
from trainplan.cli import main
from trainplan.execute import load_plan
from trainplan.execute.validate import ValidateSettings, validate_plan
from trainplan.export.loss_head_op import linear_cross_entropy
from trainplan.export.tables import graph_tables
from trainplan.export.trace import trace_training_step
from trainplan.io import write_json, write_yaml
from trainplan.models import build_model
from trainplan.pipeline.plot import plot_timeline
from trainplan.pipeline.report import holds_run, median_repeat, memory_check, rank_numbers, with_communication
from trainplan.pipeline.simulate import held_in_flight
from trainplan.pipeline.tied import TiedPartial, TiedReduction
from trainplan.partition import (BalanceSettings, SolverSettings, StageScheduler, balance, partition_graph,
                                 pipeline_graph, plan_dict, range_tables)
from trainplan.partition.balance import evaluate, partition_plan
from trainplan.schedule.pipeline_hold import PipelineHold, others_held

REPO = Path(__file__).resolve().parents[1]


def write_plan(tiny_gpt2, path: Path, k: int, spec: dict = TINY_GPT2, name: str = "tiny_gpt2", schedule: str = "1f1b",
               m: int = 4, stages_per_rank: int = 1) -> Path:
    """A balance plan of tiny GPT-2 (traced as ``spec`` says) in ``k`` stages for ``schedule`` with ``m``
    micro-batches (and ``stages_per_rank``), each at 0.5 of its peak (recomputes planned), with a stand-in profile
    (time proportional to FLOPs), and a config naming the model, in ``path``."""
    _, _, _, tables = tiny_gpt2
    nodes = tables.nodes.assign(time_s=1e-6 + tables.nodes["flops"] * 1e-12)
    graph = pipeline_graph(nodes, tables.tensors)
    ranges = range_tables(graph)
    scheduler = StageScheduler(nodes, tables.tensors, bandwidth=1e9, budget=0.5,
                               solver=SolverSettings(time_limit_s=1.0, workers=1, seed=0), swap=False,
                               pipeline=PipelineHold(k, m, schedule, stages_per_rank))
    settings = BalanceSettings(threshold=0.0, max_iterations=1, micro_batches=m, tolerance=0.02)
    result = balance(graph, ranges, partition_graph(graph, ranges, k, tolerance=0.02), scheduler, settings)
    plan = {"model": name, "device": "cpu", "k": k, **Budget(fraction=0.5).fields(),
            **plan_dict(graph, result, settings, None)}
    assert any(st["schedule"]["recomputes"] > 0 for st in plan["stages"])
    write_json(path / "plan.json", plan)
    write_yaml(path / "config.yaml", {"seed": 0, "models": {name: spec}})
    return path


@pytest.fixture(scope="module")
def plan_dir(tiny_gpt2, tmp_path_factory) -> Path:
    return write_plan(tiny_gpt2, tmp_path_factory.mktemp("balance") / "k2", 2)


@pytest.fixture(scope="module")
def gpipe_plan_dir(tiny_gpt2, tmp_path_factory) -> Path:
    """The k=2 plan made for GPipe with m=2: each rank's budget holds both micro-batches' stashes."""
    return write_plan(tiny_gpt2, tmp_path_factory.mktemp("balance_gpipe") / "k2", 2, schedule="gpipe", m=2)


def pipeline_run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "trainplan.cli", "pipeline-run", *args], capture_output=True,
                          text=True, env=env, timeout=300, check=False)


WTE = "transformer.wte.weight"
#: a two-layer Llama (untied LM head) small enough for a pipeline test
TINY_LLAMA_2L = {**TINY_LLAMA, "config": {**TINY_LLAMA["config"], "num_hidden_layers": 2}}


# each schedule once (10 s a run), each way of reducing the tied embedding's gradient once
@pytest.mark.parametrize(("schedule", "m", "tied"), [("gpipe", 2, "micro-batch"), ("1f1b", 4, "step")])
def test_a_k2_plan_runs_as_a_pipeline_with_the_single_process_steps_numbers(plan_dir, gpipe_plan_dir, schedule, m,
                                                                            tied, tmp_path):
    plan_dir = gpipe_plan_dir if schedule == "gpipe" else plan_dir  # each run with a plan made for its schedule
    out = tmp_path / "run.json"
    done = pipeline_run(str(plan_dir), "--config", str(plan_dir / "config.yaml"), "--schedule", schedule,
                        "-m", str(m), "--check", "-o", str(out), "--repeats", "2", "--tied-grads", tied)
    assert done.returncode == 0, done.stderr[-4000:]
    run = json.loads(out.read_text())
    assert (run["k"], run["schedule"], run["micro_batches"], run["backend"]) == (2, schedule, m, "gloo")
    # every rank's gradients and the last rank's micro-batch losses: bit for bit the single-process planned step's,
    # but the tied embedding's when its partial is summed over the micro-batches and sent once (round-off)
    assert run["check"] == {"planned_bit_identical": True, "eager_close": True, "tied_reduced_close": True}
    ranks = run["ranks"]
    wte_bytes = 512 * 64 * 4
    if tied == "step":  # the LM head's partial (stage 1) reaches the embedding's gradient (stage 0) once per step
        assert ranks[0]["tied_partials"] == ranks[1]["tied_partials"] and [
            (p["parameter"], p["producer"], p["receiver"]) for p in ranks[0]["tied_partials"]] == [(WTE, 1, 0)]
        assert ranks[0]["check"]["planned"]["tied_reduced"] == [WTE]
        assert 0 < run["stages"][0]["carrier_out_bytes"] < wte_bytes and ranks[0]["tied_receive_s"] > 0
        assert ranks[1]["tied_send_s"] > 0 and ranks[1]["tied_receive_s"] == 0
        assert run["prediction"]["tied_reduce_s"] == ranks[0]["tied_receive_s"]
    else:  # the partial in every carrier, which has one size both ways
        assert all(r["tied_partials"] == [] and r["tied_receive_s"] == 0 for r in ranks)
        assert run["stages"][0]["carrier_out_bytes"] >= wte_bytes and ranks[0]["check"]["planned"]["tied_reduced"] == []
    assert [r["rank"] for r in ranks] == [0, 1] and [r["stages"] for r in ranks] == [[0], [1]]
    assert [(st["stage"], st["rank"]) for st in run["stages"]] == [(0, 0), (1, 1)]
    assert (run["world_size"], run["stages_per_rank"]) == (2, 1)
    names = [n for r in ranks for n in r["check"]["parameters"]]
    built = build_model("tiny_gpt2", TINY_GPT2, seed=0)
    assert sorted(names) == sorted(n for n, _ in built.module.named_parameters())  # each gradient on one rank
    for r in ranks:
        assert r["check"]["planned"]["max_abs_diff_grad"] == 0.0 or r["check"]["planned"]["tied_reduced"]
        assert 0 < r["forward_half_s"] + r["backward_half_s"] <= r["compute_s"] <= r["step_s"]
        assert r["send_recv_s"] > 0 and r["idle_s"] == pytest.approx(r["step_s"] - r["compute_s"] - r["send_recv_s"])
        assert r["peak_bytes"] is None or r["peak_bytes"] > 0 and r["metered_step_s"] > 0
        assert r["peak_bytes"] is None or r["peak_bytes"] == statistics.median(r["peak_bytes_readings"])
        assert len(r["peak_bytes_readings"]) == run["repeats"]
    for st in run["stages"]:
        assert 0 < st["split_event"] < st["events"] and st["stash_values"] > 0
    assert run["stages"][0]["carrier_out_bytes"] == run["stages"][1]["carrier_in_bytes"] > 0
    # PipelineStage's receive buffers, read off each rank's stage: one carrier per micro-batch, gradients on rank 0
    assert [r["receive_buffer_bytes"] for r in ranks] == [m * run["stages"][0]["carrier_out_bytes"]] * 2
    # timed with the heap kept, as the profile times; the peak metered in more steps with freed memory returned
    assert run["malloc"].startswith("timed: glibc malloc keeps") and "metered: glibc malloc returns" in run["malloc"]
    plan = json.loads((plan_dir / "plan.json").read_text())
    for r, mem, st in zip(ranks, run["memory"], plan["stages"]):
        assert (mem["budget_bytes"], mem["fixed_bytes"], mem["status"]) == (st["rank_budget_bytes"],
                                                                            st["fixed_bytes"], st["rank_status"])
        assert mem["planned_for"] == {"schedule": schedule, "micro_batches": m, "stages_per_rank": 1}
        assert mem["planned_for_run"]
        assert mem["receive_buffer_bytes"] == r["receive_buffer_bytes"]
        assert mem["measured_tensor_peak_bytes"] == st["fixed_bytes"] + r["receive_buffer_bytes"] + r[
            "tensor_peak_bytes"]
        if schedule == "1f1b" and tied == "step":  # the plan's accounting: the tensors held within 5% of it
            assert mem["measured_tensor_peak_bytes"] == pytest.approx(mem["predicted_peak_bytes"], rel=0.05)
        elif tied == "step":  # GPipe: every gradient send pending until the last backward counted, none left out
            assert mem["measured_tensor_peak_bytes"] <= mem["predicted_peak_bytes"]
        if r["peak_bytes"] is not None:
            assert mem["measured_peak_bytes"] == st["fixed_bytes"] + r["receive_buffer_bytes"] + r["peak_bytes"]
            assert mem["within_budget"] == (mem["measured_peak_bytes"] <= st["rank_budget_bytes"])
    # the losses: m micro-batches (seeds 0..m-1), the step's loss their mean, as eager computes them here
    assert len(run["losses"]) == m and run["loss"] == pytest.approx(sum(run["losses"]) / m)
    with torch.no_grad():
        eager = [float(built.loss_fn(built.module(**build_model("tiny_gpt2", TINY_GPT2, seed=i).batch)))
                 for i in range(m)]
    assert run["losses"] == pytest.approx(eager, rel=1e-5)
    pred = run["prediction"]
    assert pred["step_time_s"] == pytest.approx((m + 1) * pred["t_max_s"])
    # the rank's peak: its schedule's, its gradient sums (m > 1), and the stash of each other micro-batch in flight
    n = [min(2 - s, m) for s in range(2)] if schedule == "1f1b" else [m, m]
    assert pred["in_flight"] == n
    # and, under GPipe, the m - 1 gradient carriers stage 1 sent back before its last backward and waits on after
    # it, each in place of a stash (1F1B: stage 0's one pending send has no gradient carrier to send back)
    carrier = run["stages"][0]["carrier_out_bytes"]
    pending = [m - 1] * 2 if schedule == "gpipe" else [1, 0]
    assert pred["pending_gradient_sends"] == pending
    assert pred["peak_bytes"] == [p + g * (m > 1) + c + others_held(i, a, q, into) for p, g, c, a, i, q, into in zip(
        pred["schedule_peak_bytes"], pred["gradient_sum_bytes"], pred["carrier_bytes"], pred["stash_bytes"], n,
        pending, [0, carrier])]
    # the carriers: on stage 0 each in-flight micro-batch's forward carrier and one more (GPipe: every one it
    # sent, m); on stage 1 the gradient carrier it packs; on each, a receive buffer per micro-batch
    inputs = [st["problem"]["input_bytes"] for st in plan["stages"]]
    assert inputs[0] > 0
    forward = m if schedule == "gpipe" else n[0] + 1
    assert pred["carrier_bytes"] == [(forward + m) * carrier + n[0] * inputs[0],
                                     (1 + m) * carrier + n[1] * inputs[1] + m * 4]
    if tied == "step":  # the plan's carriers are the run's
        assert [st["carrier_bytes"] for st in plan["stages"]] == pred["carrier_bytes"]
    assert pred["stash_bytes"] == [st["stash_bytes"] for st in plan["stages"]]
    assert [st["in_flight"] for st in plan["stages"]] == n  # the plan holds the run's in-flight micro-batches
    if tied == "step":  # with the plan's carriers, the run's predicted rank peaks are the plan's
        assert pred["peak_bytes"] == [st["rank_peak_bytes"] for st in plan["stages"]]
    assert pred["comm_per_micro_batch_s"] == pytest.approx([r["send_recv_s"] / m for r in ranks])
    assert pred["step_time_with_comm_s"] == pytest.approx(
        (m + 1) * max(t + c for t, c in zip(pred["stage_times_s"], pred["comm_per_micro_batch_s"]))
        + pred["tied_reduce_s"])
    assert run["measured"]["over_predicted_with_comm"] == pytest.approx(run["measured"]["step_s"]
                                                                        / pred["step_time_with_comm_s"])
    # the median step's compute calls, per rank: each micro-batch's forward before its backward
    assert run["repeats"] == 2 and len(run["measured"]["step_s_repeats"]) == 2
    for actions in run["timeline"]["ranks"]:
        assert sorted((a["kind"], a["micro_batch"]) for a in actions) == sorted(
            (kind, i) for kind in "FB" for i in range(m))
        start = {(a["kind"], a["micro_batch"]): a["start_s"] for a in actions}
        assert all(start["F", i] < start["B", i] for i in range(m))
    if schedule == "gpipe":  # fill-drain: every forward before the first backward
        assert all(a["kind"] == "F" for a in run["timeline"]["ranks"][0][:m])
    else:  # 1F1B at k = 2: stage 0 runs one forward ahead, stage 1 alternates
        assert [(a["kind"], a["micro_batch"]) for a in run["timeline"]["ranks"][0]] == [
            ("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    # the schedule simulated in that order from the stages' costs alone and the measured transfers
    sim = run["simulated"]
    assert [len(a) for a in sim["timeline"]] == [2 * m, 2 * m]
    alone = [st["alone"] for st in run["stages"]]
    assert [a["forward_s"] for a in alone] == sim["costs"]["forward_s"] and all(
        0 < a["forward_s"] and 0 < a["backward_s"] for a in alone)
    assert sim["costs"]["backward_transfer_s"] == [max(r["transfer_s"]["backward"][0] for r in ranks)] and all(
        r["transfer_s"]["forward"][0] > 0 for r in ranks)
    busy = max(m * (a["forward_s"] + a["backward_s"]) for a in alone)
    assert sim["costs"]["tied_reduce_s"] == pred["tied_reduce_s"]
    assert busy < sim["step_time_s"] == pytest.approx(max(sim["rank_end_s"]) + pred["tied_reduce_s"])
    assert run["measured"]["over_simulated"] == pytest.approx(run["measured"]["step_s"] / sim["step_time_s"])
    assert run["measured"]["co_run_slowdown"] == pytest.approx(
        [r["compute_s"] / (m * (a["forward_s"] + a["backward_s"])) for r, a in zip(ranks, alone)])


def test_a_k3_plan_relays_what_a_stage_two_away_reads(tiny_gpt2, tmp_path):
    """Stage 0's mask and positions read by stage 2: relayed through stage 1; stage 2's partial gradient of the tied
    embedding, read by stage 0, crosses stage 1 as zeros and is sent straight to stage 0 once per step; the other
    gradients still bit for bit the single-process step's."""
    plan_dir = write_plan(tiny_gpt2, tmp_path / "k3", 3)
    out = tmp_path / "run.json"
    done = pipeline_run(str(plan_dir), "--config", str(plan_dir / "config.yaml"), "--schedule", "1f1b", "-m", "3",
                        "--check", "-o", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    run = json.loads(out.read_text())
    assert run["k"] == 3 and run["check"] == {"planned_bit_identical": True, "eager_close": True,
                                              "tied_reduced_close": True}
    tied = [(p["parameter"], p["producer"], p["receiver"]) for p in run["ranks"][1]["tied_partials"]]
    assert tied == [(WTE, 2, 0)]
    assert [st["relayed_storages"] for st in run["stages"]][0] == 0 and run["stages"][1]["relayed_storages"] > 0
    assert run["stages"][2]["relayed_storages"] == 0


def test_a_cut_between_an_op_and_the_views_of_its_output_runs(tiny_gpt2, tmp_path):
    """Stage 0 ends with the first attention's kernel, stage 1 starts with the views of its output (the exact DP
    cut GPT-2 small there at 0.5, GPipe, m=8): the attention's backward, on stage 0, reads a view a stage-1 node
    makes of a storage stage 0 holds; stage 0 views it itself, and the numbers are the single-process step's."""
    _, _, _, tables = tiny_gpt2
    nodes = tables.nodes.assign(time_s=1e-6 + tables.nodes["flops"] * 1e-12)
    graph = pipeline_graph(nodes, tables.tensors)
    names = [graph.names[i] for i in np.flatnonzero(graph.forward)]
    cut = next(i for i, n in enumerate(names) if n.startswith("detach") and names[i - 1].startswith("getitem")
               and names[i - 3].startswith("_scaled_dot_product"))
    scheduler = StageScheduler(nodes, tables.tensors, bandwidth=1e9, budget=0.5,
                               solver=SolverSettings(time_limit_s=1.0, workers=1, seed=0), swap=False,
                               pipeline=PipelineHold(2, 2))
    evaluated = evaluate(graph, range_tables(graph), (0, cut, len(names)), scheduler, 2)
    plan = {"model": "tiny_gpt2", "device": "cpu", "k": 2, **Budget(fraction=0.5).fields(),
            **partition_plan(evaluated)}
    write_json(tmp_path / "plan.json", plan)
    write_yaml(tmp_path / "config.yaml", {"seed": 0, "models": {"tiny_gpt2": TINY_GPT2}})
    out = tmp_path / "run.json"
    done = pipeline_run(str(tmp_path), "--config", str(tmp_path / "config.yaml"), "--schedule", "1f1b", "-m", "2",
                        "--check", "-o", str(out), "--repeats", "1")
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(out.read_text())["check"] == {"planned_bit_identical": True, "eager_close": True,
                                                    "tied_reduced_close": True}


@pytest.mark.parametrize("spec", [TINY_GPT2, TINY_LLAMA_2L], ids=["gpt2_tied", "llama_untied"])
def test_a_plan_with_the_chunked_loss_head_runs_as_a_pipeline(spec, tmp_path):
    """``loss_chunk`` in the model's entry: the plan made on the chunked trace; the last stage's forward half
    computes the loss and both head gradients in one op, adding the head weight's gradient (GPT-2: the tied
    embedding's partial, reduced once per step; Llama: the LM head's own) into its sum there; the numbers are the
    single-process step's, and each rank holds the tensors its plan counts."""
    spec = {**spec, "loss_chunk": "8KiB"}
    built = build_model("tiny_lm", spec, seed=0)
    traced, flat = trace_training_step(built)
    assert any(n.target is linear_cross_entropy._opoverload for n in traced.gm.graph.nodes)
    plan_dir = write_plan((built, traced, flat, graph_tables(traced)), tmp_path / "k2", 2, spec, "tiny_lm")
    out = tmp_path / "run.json"
    done = pipeline_run(str(plan_dir), "--config", str(plan_dir / "config.yaml"), "--schedule", "1f1b", "-m", "4",
                        "--check", "-o", str(out), "--repeats", "1")
    assert done.returncode == 0, done.stderr[-4000:]
    run = json.loads(out.read_text())
    assert run["check"] == {"planned_bit_identical": True, "eager_close": True, "tied_reduced_close": True}
    tied = [(p["parameter"], p["producer"], p["receiver"]) for p in run["ranks"][1]["tied_partials"]]
    assert tied == ([(WTE, 1, 0)] if spec["architecture"] == "GPT2LMHeadModel" else [])
    for mem in run["memory"]:
        assert mem["measured_tensor_peak_bytes"] == pytest.approx(mem["predicted_peak_bytes"], rel=0.05)


def test_interleaved_1f1b_runs_two_stages_on_each_rank_with_the_single_process_steps_numbers(tiny_gpt2, tmp_path):
    """A k=4 plan made for 2 ranks, stage s on rank s mod 2, under torch's Interleaved1F1B with m=2 (in flight:
    2, 2, 2, 1 micro-batches, unlike 1F1B's or GPipe's): the ranks alternate their two stages in the order the
    plan was made for; losses and gradients are the single-process step's (the tied embedding's, made by stage 3
    on rank 1 and added by stage 0 on rank 0, within round-off); the prediction counts each rank's two stages; the
    tensors a rank holds stay within the sum of its stages' predicted peaks and budgets."""
    m = 2
    plan_dir = write_plan(tiny_gpt2, tmp_path / "k4", 4, schedule="interleaved1f1b", m=m, stages_per_rank=2)
    out = tmp_path / "run.json"
    done = pipeline_run(str(plan_dir), "--config", str(plan_dir / "config.yaml"), "--schedule", "interleaved1f1b",
                        "-m", str(m), "--check", "-o", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    run = json.loads(out.read_text())
    assert (run["k"], run["world_size"], run["stages_per_rank"], run["schedule"]) == (4, 2, 2, "interleaved1f1b")
    assert run["check"] == {"planned_bit_identical": True, "eager_close": True, "tied_reduced_close": True}
    ranks, stages = run["ranks"], run["stages"]
    assert [r["stages"] for r in ranks] == [[0, 2], [1, 3]] and [st["rank"] for st in stages] == [0, 1, 0, 1]
    assert [(p["parameter"], p["producer"], p["receiver"]) for p in ranks[0]["tied_partials"]] == [(WTE, 3, 0)]
    assert ranks[0]["tied_receive_s"] > 0 and ranks[1]["tied_send_s"] > 0
    names = [n for r in ranks for n in r["check"]["parameters"]]
    built = build_model("tiny_gpt2", TINY_GPT2, seed=0)
    assert sorted(names) == sorted(n for n, _ in built.module.named_parameters())
    with torch.no_grad():
        eager = [float(built.loss_fn(built.module(**build_model("tiny_gpt2", TINY_GPT2, seed=i).batch)))
                 for i in range(m)]
    assert run["losses"] == pytest.approx(eager, rel=1e-5)
    orders = []
    for r, actions in zip(ranks, run["timeline"]["ranks"]):
        order = [(a["kind"], a["stage"], a["micro_batch"]) for a in actions]
        assert sorted(order) == sorted((kind, s, i) for kind in "FB" for s in r["stages"] for i in range(m))
        first, second = r["stages"]  # interleaved: the later stage's forwards before the earlier's backwards
        assert order.index(("F", second, 0)) < order.index(("B", first, 0))
        orders.append(order)
    pred = run["prediction"]  # torch's declared order, as the plan was made for, is the order that ran
    assert pred["in_flight"] == run["measured"]["in_flight"] == held_in_flight(orders, 4) == [2, 2, 2, 1]
    t = pred["stage_times_s"]
    assert pred["step_time_s"] == pytest.approx(m * max(t[0] + t[2], t[1] + t[3]) + max(t))
    sim = run["simulated"]
    assert sim["costs"]["forward_s"] == [st["alone"]["forward_s"] for st in stages]
    assert [len(a) for a in sim["timeline"]] == [4 * m, 4 * m]
    for mem, r in zip(run["memory"], ranks):
        on = [run["stages"][s] for s in r["stages"]]
        assert mem["stages"] == r["stages"] and mem["planned_for_run"]
        assert mem["tensors_within_budget"]
        plan = json.loads((plan_dir / "plan.json").read_text())["stages"]
        assert mem["budget_bytes"] == sum(plan[st["stage"]]["rank_budget_bytes"] for st in on)
        assert mem["predicted_peak_bytes"] == sum(pred["peak_bytes"][s] for s in r["stages"])
        assert 0.8 * mem["predicted_peak_bytes"] <= mem["measured_tensor_peak_bytes"] <= mem["predicted_peak_bytes"]
    plot_timeline(run, str(tmp_path / "timeline.png"))  # a row per rank, its stages' calls in it
    assert (tmp_path / "timeline.png").stat().st_size > 10_000


def test_a_missing_plan_dir_is_named(tmp_path, capsys):
    assert main(["pipeline-run", str(tmp_path / "nowhere"), "--config", str(tmp_path / "c.yaml")]) == 2
    assert "nowhere: no such directory or file" in capsys.readouterr().err


def test_more_stages_than_ranks_is_refused(plan_dir, monkeypatch, capsys):
    """As under ``torchrun --nproc-per-node 1``: the rank refuses before joining any process group."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert main(["pipeline-run", str(plan_dir), "--config", str(plan_dir / "config.yaml")]) == 2
    assert "the plan has k=2 stages but 1 rank(s) were launched" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--schedule", "1f1b", "-m", "1"], "1F1B needs at least as many micro-batches as stages: m=1 < k=2"),
    (["--model", "gpt9"], "no model 'gpt9' under 'models'"),
    (["--schedule", "1f1b", "--stages-per-rank", "2"], "1f1b runs one stage per rank, not 2 (use interleaved1f1b)"),
    (["--schedule", "interleaved1f1b"], "2 stage(s) per rank does not fit k=2"),
])
def test_bad_settings_are_refused_before_launching(plan_dir, args, message, capsys):
    assert main(["pipeline-run", str(plan_dir), "--config", str(plan_dir / "config.yaml"), *args]) == 2
    assert message in capsys.readouterr().err



def test_the_prediction_with_send_recv_adds_each_stages_transfers_to_its_slot():
    predicted = {"stage_times_s": [1.0, 0.8], "step_time_s": 5.0}
    out = with_communication(predicted, [0.4, 1.2], m=4)  # per micro-batch: 0.1 and 0.3 s
    assert out["comm_per_micro_batch_s"] == pytest.approx([0.1, 0.3])
    assert out["step_time_with_comm_s"] == pytest.approx(5 * 1.1)  # (m + k - 1) * max(1.1, 1.1)
    assert out["step_time_s"] == 5.0 and out["tied_reduce_s"] == 0.0
    # a once-per-step reduction of tied gradients is paid once, after the schedule
    assert with_communication(predicted, [0.4, 1.2], m=4, tied_reduce_s=0.25)["step_time_with_comm_s"] == \
        pytest.approx(5 * 1.1 + 0.25)
    # four stages on two ranks (stages 0, 2 and 1, 3): each rank's per-micro-batch load is its stages' times and its
    # transfers (1.0 + 0.6 + 0.1, 0.8 + 0.5 + 0.3), the bubble one slot of the slowest stage with its share of them
    four = with_communication({"stage_times_s": [1.0, 0.8, 0.6, 0.5]}, [0.4, 1.2], m=4)
    assert four["step_time_with_comm_s"] == pytest.approx(4 * 1.7 + (1.0 + 0.1 / 2))


def test_the_run_reports_the_median_step_and_its_timeline():
    def rank(times):
        steps = [{"step_s": t, "compute_s": t / 2, "forward_half_s": t / 4, "backward_half_s": t / 4,
                  "tied_send_s": 0.0, "tied_receive_s": t / 10, "peak_bytes": int(t * 100), "peak_method": "m",
                  "actions": [{"kind": "F", "start_s": t}]}
                 for t in times]
        return rank_numbers(steps, [0.1, 0.3, 0.2])

    ranks = [rank([1.0, 3.0, 2.0]), rank([1.5, 2.5, 2.6])]
    assert ranks[0]["step_s"] == 2.0 and ranks[0]["send_recv_s"] == 0.2 and "peak_bytes" not in ranks[0]
    assert ranks[0]["idle_s"] == pytest.approx(2.0 - 1.0 - 0.2) and ranks[0]["tied_receive_s"] == 0.2
    assert median_repeat(ranks) == (2, [1.5, 3.0, 2.6])  # the slowest rank per step: median 2.6, step 2


def test_a_ranks_measured_peak_counts_what_it_held_before_the_step_against_its_budget():
    data = {"stages": [{"status": "raised", "budget_bytes": 600, "rank_budget_bytes": 1000, "fixed_bytes": 400},
                       {"status": "feasible", "budget_bytes": 800, "fixed_bytes": 300}]}  # a plan before rank budgets
    # 400 + 50 + 650 = 1100 > 1000 (a second stash in flight); 300 + 100 + 400 = 800 <= 800
    ranks = [{"rank": 0, "stages": [0], "peak_bytes": 650, "receive_buffer_bytes": 50},
             {"rank": 1, "stages": [1], "peak_bytes": 400, "receive_buffer_bytes": 100}]
    out = memory_check(data, ranks, {"peak_bytes": [1150, 790]}, "1f1b", 4)
    assert [(m["measured_peak_bytes"], m["within_budget"], m["predicted_peak_bytes"]) for m in out] == [
        (1100, False, 1150), (800, True, 790)]
    assert out[0]["status"] == "raised"
    assert [(m["planned_for"], m["planned_for_run"]) for m in out] == [(None, False)] * 2  # no pipeline hold
    held = {"stages": [{**st, "problem": {"pipeline": {"schedule": "1f1b", "micro_batches": 4}}}
                       for st in data["stages"]]}
    assert [m["planned_for_run"] for m in memory_check(held, ranks, {"peak_bytes": [1, 1]}, "1f1b", 4)] == [True] * 2
    # a 1F1B plan run under GPipe, with more micro-batches, or with fewer in flight: its budgets do not hold the run
    for schedule, m in (("gpipe", 4), ("1f1b", 8), ("1f1b", 1)):
        assert not any(m["planned_for_run"] for m in memory_check(held, ranks, {"peak_bytes": [1, 1]}, schedule, m))
    # under 1F1B with k <= m' <= m the stages hold as many micro-batches as planned (2 and 1)
    assert [m["planned_for_run"] for m in memory_check(held, ranks, {"peak_bytes": [1, 1]}, "1f1b", 2)] == [True] * 2
    gpipe = {"stages": [{**st, "problem": {"pipeline": {"schedule": "gpipe", "micro_batches": 4}}}
                        for st in data["stages"]]}
    assert holds_run(gpipe["stages"], "gpipe", 4) == [True, True]
    assert holds_run(gpipe["stages"], "gpipe", 2) == holds_run(gpipe["stages"], "1f1b", 4) == [False, False]
    assert holds_run(held["stages"], "gpipe", 2) == [True, False]  # stage 0: 2 in flight either way
    # a multi-stage schedule: the in-flight counts read off the run's order against the planned ones
    assert holds_run(held["stages"], "interleaved1f1b", 4, [2, 1]) == [True, True]
    assert holds_run(held["stages"], "interleaved1f1b", 4, [2, 2]) == [True, False]
    with pytest.raises(ValueError, match="1 stage\\(s\\) per rank does not fit k=2"):  # its counts are needed
        holds_run(held["stages"], "interleaved1f1b", 4)
    unmetered = memory_check(data, [{**ranks[0], "peak_bytes": None}, {**ranks[1], "peak_bytes": 1}],
                             {"peak_bytes": None}, "1f1b", 4)
    assert unmetered[0]["within_budget"] is None and unmetered[1]["predicted_peak_bytes"] is None


def test_a_pipeline_plans_stages_validate_alone_within_their_raised_budgets(plan_dir, tiny_gpt2):
    """Validation runs each stage of a pipeline plan alone, one micro-batch: it holds every gradient to the end and
    receives the tied partial, which the schedule (made with the gradients added into their sums where made) does
    not hold. The stated peak is the schedule's problem's; the measured one is the stage-alone replay's, within the
    budget raised by those bytes."""
    built, _, _, tables = tiny_gpt2
    plan, stages = load_plan(plan_dir / "plan.json")
    done = validate_plan(built, plan, stages, tables.tensors,
                         settings=ValidateSettings(repeats=1, warmup=0, attempts=1, allocator_check=False))
    assert all(st.held_bytes > 0 for st in stages)
    for st, rep in zip(stages, done.report["stages"]):
        assert rep["measured_peak_bytes"] == rep["predicted_storage_peak_bytes"]
        assert rep["predicted_peak_bytes"] == st.alone_peak_bytes >= rep["predicted_storage_peak_bytes"]
        assert st.alone_peak_bytes > st.schedule["peak_bytes"]
        assert rep["budget_bytes"] == st.budget_bytes == st.schedule["budget_bytes"] + st.held_bytes
        assert rep["budget_respected"], rep
        assert [r for r in rep["reasons"] if "step time" not in r] == []  # the profile here is a stand-in


def test_a_tied_partial_made_and_added_on_one_rank_is_handed_over_without_a_send():
    """Stages 1 and 3 on rank 1 of 2: the partial stage 3 sums over the micro-batches goes into the gradient stage 1
    computes, scaled by 1/m, with no process group (a send would fail here)."""
    partial = TiedPartial(7, producer=3, receiver=1, param=0, name="w", shape=(2, 3), dtype=torch.float32)
    tied = TiedReduction(frozenset({1, 3}), 2, {7: partial}, torch.device("cpu"))
    terms = [torch.arange(6.0).reshape(2, 3), torch.ones(2, 3)]
    tied.accumulate((7,), [terms[0].clone().untyped_storage()])
    tied.add(7, terms[1].clone().untyped_storage())
    param = torch.nn.Parameter(torch.zeros(2, 3))
    param.grad = torch.full((2, 3), 10.0)
    tied.reduce({0: param}, m=2)
    assert torch.equal(param.grad, 10.0 + (terms[0] + terms[1]) / 2) and tied.receive_s > 0 and tied.send_s == 0
