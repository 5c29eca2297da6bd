"""The fuse rules in the tiny study: groups checked independently, compiled groups checked against eager."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from trainplan.fuse.check import check_grouping
from trainplan.fuse.exported import graph_from_export

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
    nodes = pd.read_parquet(work / "results/export/small_cnn/cpu/nodes.parquet")
    tensors = pd.read_parquet(work / "results/export/small_cnn/cpu/tensors.parquet")
    graph = graph_from_export(nodes, tensors)
    edges = [(graph.names[u], graph.names[v]) for u, v in graph.edges()]
    for target in ("acclib", "inductor"):
        doc = json.loads((work / root / target / "groups.json").read_text())
        eligible = {m for g in doc["groups"] for m in g["nodes"]}
        assert eligible.isdisjoint(doc["host_nodes"]) and eligible | set(doc["host_nodes"]) == set(graph.names)
        assert check_grouping(graph.names, edges, eligible, doc["groups"]) == []
        compare = pd.read_csv(work / root / target / "compare.csv")
        assert compare["coverage_ops"].iloc[0] == compare["coverage_ops"].min()  # the baselines cover more
    summary = json.loads((work / root / "inductor/measure.json").read_text())
    measured = pd.read_parquet(work / root / "inductor/measure.parquet")
    assert summary["groups_measured"] == len(measured) == min(2, summary["groups_eligible"]) > 0
    assert summary["fused_step_check"]["within_tolerance"] and summary["fused_step_check"]["max_abs_diff"] <= 1e-4
    assert summary["whole_check"]["max_abs_diff"] <= 1e-4
    assert (measured[["unfused_s", "fused_s", "compile_s"]] > 0).all().all()
    assert (measured["kernels_fused"] >= 1).all()
    assert (work / "results/plots/small_cnn/cpu/fuse_inductor.png").stat().st_size > 10_000
    train = json.loads((work / root / "inductor/train_step.json").read_text())
    train_groups = pd.read_parquet(work / root / "inductor/train_groups.parquet")
    assert train["check_float64"]["within_tolerance"] and len(train["samples_s"]["fused"]) == 3
    assert len(train_groups) == train["groups_compiled"] > 0
    assert (work / "results/plots/small_cnn/cpu/fuse_train_inductor.png").stat().st_size > 10_000


@pytest.mark.workflow
def test_plans_on_the_fused_graph_next_to_the_raw_graph(tiny_study: Path, tmp_path: Path) -> None:
    """fuse.plan: the tiny models' fused graphs go through partition, schedule, balance and validate; the
    comparison has both graphs, the fused one with fewer ops, and its plans run with exact peaks. Runs in a copy
    of the tiny study: the raw graphs' plans are its own (file times kept: they do not rerun)."""
    copy_of_study(tiny_study, tmp_path / "w")
    cfg = yaml.safe_load(TINY.read_text())
    cfg["fuse"] = {"plan": ["inductor"], "measure": {**cfg["fuse"]["measure"], "targets": ["inductor"]}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = snakemake(tmp_path / "w", config, "results/fuse/cpu/plan_compare.csv")
    assert out.returncode == 0, out.stderr[-4000:]
    work = tmp_path / "w"
    table = pd.read_csv(work / "results/fuse/cpu/plan_compare.csv")
    assert sorted(zip(table.model, table.graph)) == [("small_cnn", "inductor"), ("small_cnn", "raw"),
                                                     ("tiny_gpt2", "inductor"), ("tiny_gpt2", "raw")]
    fused, raw = table[table.graph == "inductor"].set_index("model"), table[table.graph == "raw"].set_index("model")
    assert (fused.problem_ops < raw.problem_ops).all() and (fused.graph_ops < raw.graph_ops).all()
    assert (fused.planned_fused_kernels_s.notna()).all() and (raw.planned_fused_kernels_s.isna()).all()
    for model in ("tiny_gpt2", "small_cnn"):
        graph = json.loads((work / f"results/fuse/{model}/cpu/inductor/graph/graph.json").read_text())["fused"]
        assert graph["ops_coarse"] == fused.at[model, "graph_ops"] < graph["ops_raw"] == raw.at[model, "graph_ops"]
        ops = pd.read_parquet(work / f"results/profile/{model}+inductor/cpu/ops.parquet")
        raw_ops = pd.read_parquet(work / f"results/profile/{model}/cpu/ops.parquet")
        assert ops.time_s.sum() == pytest.approx(raw_ops.time_s.sum())
        report = json.loads((work / f"results/validate/{model}+inductor/cpu/k1/b0.6/validation.json").read_text())
        assert report["gradients"]["vs_compiled_step"]["within_tolerance"] and report["gradients"]["vs_interpreter"]["bit_exact"]
        for stage in report["stages"]:
            assert stage["measured_peak_bytes"] == stage["predicted_peak_bytes"] <= stage["budget_bytes"]
