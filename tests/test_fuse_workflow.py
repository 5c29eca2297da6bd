"""The fuse rules in the tiny study: groups checked independently, compiled groups checked against eager; plans on the
fused model next to the raw model's."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from tests.conftest import SMALL_CNN
from trainplan.execute import load_step
from trainplan.fuse.check import check_grouping
from trainplan.fuse.forward import op_graph, trace_forward
from trainplan.fuse.fused_ops import NAMESPACE
from trainplan.fuse.planned import fused_spec
from trainplan.models import build_model

from test_workflow import TINY, snakemake
from workflow_run import copy_of_study


@pytest.mark.workflow
def test_fuse_and_measure_on_the_tiny_study(tiny_study: Path, tmp_path: Path) -> None:
    """In a copy of the tiny study (its exports and groups kept): the groups checked, two compiled and measured,
    the fused training step."""
    work = copy_of_study(tiny_study, tmp_path / "w")
    root = "results/fuse/small_cnn/cpu"
    out = snakemake(work, TINY, f"{root}/acclib/groups.json", f"{root}/inductor/measure.json",
                    "results/plots/small_cnn/cpu/fuse_inductor.png", "results/plots/small_cnn/cpu/fuse_train_inductor.png")
    assert out.returncode == 0, out.stderr[-4000:]
    graph = op_graph(trace_forward(build_model("small_cnn", SMALL_CNN, seed=0)).gm)  # the rule groups the forward
    edges = [(graph.names[u], graph.names[v]) for u, v in graph.edges()]
    exported = set(pd.read_parquet(work / "results/export/small_cnn/cpu/nodes.parquet")["name"])
    for target in ("acclib", "inductor"):
        doc = json.loads((work / root / target / "groups.json").read_text())
        eligible = {m for g in doc["groups"] for m in g["nodes"]}
        assert doc["graph"]["grouped"] == "forward" and eligible <= exported  # its ops named as in the step
        assert eligible.isdisjoint(doc["host_nodes"]) and eligible | set(doc["host_nodes"]) == set(graph.names)
        assert check_grouping(graph.names, edges, eligible, doc["groups"]) == []
        compare = pd.read_csv(work / root / target / "compare.csv")
        assert compare["coverage_ops"].iloc[0] == compare["coverage_ops"].min()  # the baselines cover more
    summary = json.loads((work / root / "inductor/measure.json").read_text())
    measured = pd.read_parquet(work / root / "inductor/measure.parquet")
    assert summary["groups_measured"] == len(measured) == min(2, summary["groups_eligible"]) > 0
    assert summary["fused_forward_check"]["within_tolerance"] and summary["fused_forward_check"]["max_abs_diff"] <= 1e-4
    assert summary["whole_check"]["max_abs_diff"] <= 1e-4
    assert (measured[["unfused_s", "fused_s", "compile_s"]] > 0).all().all()
    assert (measured["kernels_fused"] >= 1).all()
    assert (work / "results/plots/small_cnn/cpu/fuse_inductor.png").stat().st_size > 10_000
    train = json.loads((work / root / "inductor/train_step.json").read_text())
    train_groups = pd.read_parquet(work / root / "inductor/train_groups.parquet")
    assert train["check_float64"]["within_tolerance"] and len(train["samples_s"]["fused"]) == 3
    assert len(train_groups) == train["groups_compiled"] > 0
    assert (work / "results/plots/small_cnn/cpu/fuse_train_inductor.png").stat().st_size > 10_000


def _grads(module: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    return {name.removeprefix(prefix): p.grad for name, p in module.named_parameters()}


@pytest.mark.workflow
def test_plans_on_the_fused_model_next_to_the_raw_model(tiny_study: Path, tmp_path: Path) -> None:
    """fuse.plan: model 'tiny_gpt2+inductor' (tiny GPT-2 with its forward groups as fused ops) is exported, profiled,
    partitioned, scheduled, balanced and validated like any model; its traced step has fewer ops than the raw one,
    and its plan, loaded in this process (the same fused op names: the build is deterministic), trains as the raw
    model's eager step. Runs in a copy of the tiny study: the raw model's plans are its own."""
    work = copy_of_study(tiny_study, tmp_path / "w")
    cfg = yaml.safe_load(TINY.read_text())
    cfg["study"]["plan"] = ["tiny_gpt2"]
    cfg["fuse"] = {"plan": ["inductor"], "fused_ops": {"compiler": "fx"}}  # Inductor's groups; compiled: test_fuse_ops
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = snakemake(work, config, "results/fuse/cpu/plan_compare.csv")
    assert out.returncode == 0, out.stderr[-4000:]
    raw_export = "results/export/tiny_gpt2/cpu/nodes.parquet"
    assert (work / raw_export).stat().st_mtime == (tiny_study / raw_export).stat().st_mtime  # not rerun
    table = pd.read_csv(work / "results/fuse/cpu/plan_compare.csv").set_index("graph")
    assert sorted(table.index) == ["inductor", "raw"]
    fused, raw = table.loc["inductor"], table.loc["raw"]
    assert fused.graph_ops < raw.graph_ops and fused.problem_ops < raw.problem_ops
    assert fused.groups_fused > 0 and fused.ops_fused > 2 * fused.groups_fused and pd.isna(raw.groups_fused)
    graph = json.loads((work / "results/export/tiny_gpt2+inductor/cpu/graph.json").read_text())
    assert graph["n_ops"] == fused.graph_ops and graph["fusion"]["groups_fused"] == fused.groups_fused
    # the fused model's gradients against the unfused model's, both against float64 (the export's check)
    check = graph["fusion"]["gradients_vs_unfused"]
    assert check["passed"] and check["fused"]["within_tolerance"] and "float64" not in check  # run where float32 fails
    assert fused.grad_check_ratio == pytest.approx(check["fused"]["worst_ratio"]) and fused.grad_check_ratio <= 1.0
    assert fused.grads_passed == True and pd.isna(raw.grad_check_ratio)  # noqa: E712 (a CSV's object column)
    fused_nodes = pd.read_parquet(work / "results/export/tiny_gpt2+inductor/cpu/nodes.parquet")
    ops = fused_nodes.op[fused_nodes.op.str.startswith(f"{NAMESPACE}.")]  # one node per fused op
    assert ops.is_unique and ops.str.contains("_fwd").sum() == fused.groups_fused and ops.str.contains("_bwd").any()
    report = json.loads((work / "results/validate/tiny_gpt2+inductor/cpu/k1/b0.6/validation.json").read_text())
    assert report["status"] in ("passed", "unreliable") and report["reasons"] == []  # unreliable: a busy machine's times
    assert report["gradients"]["vs_interpreter"]["bit_exact"] and report["gradients"]["vs_compiled_step"]["bit_exact"]
    for stage in report["stages"]:
        assert stage["measured_peak_bytes"] == stage["predicted_storage_peak_bytes"]
        assert stage["predicted_storage_peak_bytes"] <= stage["predicted_peak_bytes"] <= stage["budget_bytes"]
    assert fused.measured_peak_bytes == max(s["measured_peak_bytes"] for s in report["stages"])
    plan = json.loads((work / "results/balance/tiny_gpt2+inductor/cpu/k1/b0.6/plan.json").read_text())
    assert fused.budget_status == ",".join(sorted({st["status"] for st in plan["stages"]}))
    # counted on the CPU: the process's rise, which on a step this small may reuse heap pages already resident (it
    # read 1.16-1.26 MB against 1.30 MB of storages once the fused ops were called without the dispatcher); the
    # allocator's peak is the tensors' bytes: most of the storages, at most what the plan predicts with the ops'
    # workspaces (the tied gradient's in-place sum holds its row sums beside one table, where the storage meter
    # sees only the table)
    memory = report["memory"]
    assert fused.counted_peak_bytes == memory["peak_bytes_counted"] == memory["peak_bytes_process"] > 0
    predicted = max(s["predicted_peak_bytes"] for s in report["stages"])
    assert 0.9 * fused.measured_peak_bytes <= memory["peak_bytes_allocator"] <= predicted
    spec = cfg["models"]["tiny_gpt2"]
    model = build_model("tiny_gpt2+inductor", fused_spec("tiny_gpt2", spec, {"builtin": "inductor"}, seed=0,
                                                          compiler="fx"), seed=0)
    step = load_step(work / "results/balance/tiny_gpt2+inductor/cpu/k1/b0.6", model.module, model.batch)
    loss, grads = step(dict(model.module.named_parameters()), model.batch)
    eager = build_model("tiny_gpt2", spec, seed=0)
    want = eager.module(**eager.batch).loss
    want.backward()
    torch.testing.assert_close(loss, want.detach(), rtol=1e-5, atol=1e-6)
    expected = _grads(eager.module)
    assert {name.removeprefix("model.") for name in grads} == set(expected)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[name.removeprefix("model.")], rtol=1e-4, atol=1e-5, msg=name)
