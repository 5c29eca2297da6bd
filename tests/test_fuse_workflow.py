"""The fuse rules in the tiny study: groups checked independently, compiled groups checked against eager."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from trainplan.fuse.check import check_grouping
from trainplan.fuse.exported import graph_from_export

from test_workflow import TINY, snakemake


@pytest.mark.workflow
def test_fuse_and_measure_on_the_tiny_study(tmp_path: Path) -> None:
    root = "results/fuse/small_cnn/cpu"
    out = snakemake(tmp_path, TINY, f"{root}/acclib/groups.json", f"{root}/inductor/measure.json",
                    "results/plots/small_cnn/cpu/fuse_inductor.png")
    assert out.returncode == 0, out.stderr[-4000:]
    nodes = pd.read_parquet(tmp_path / "results/export/small_cnn/cpu/nodes.parquet")
    tensors = pd.read_parquet(tmp_path / "results/export/small_cnn/cpu/tensors.parquet")
    graph = graph_from_export(nodes, tensors)
    edges = [(graph.names[u], graph.names[v]) for u, v in graph.edges()]
    for target in ("acclib", "inductor"):
        doc = json.loads((tmp_path / root / target / "groups.json").read_text())
        eligible = {m for g in doc["groups"] for m in g["nodes"]}
        assert eligible.isdisjoint(doc["host_nodes"]) and eligible | set(doc["host_nodes"]) == set(graph.names)
        assert check_grouping(graph.names, edges, eligible, doc["groups"]) == []
        compare = pd.read_csv(tmp_path / root / target / "compare.csv")
        assert compare["coverage_ops"].iloc[0] == compare["coverage_ops"].min()  # the baselines cover more
    summary = json.loads((tmp_path / root / "inductor/measure.json").read_text())
    measured = pd.read_parquet(tmp_path / root / "inductor/measure.parquet")
    assert summary["groups_measured"] == len(measured) == min(2, summary["groups_eligible"]) > 0
    assert summary["fused_step_check"]["within_tolerance"] and summary["fused_step_check"]["max_abs_diff"] <= 1e-4
    assert summary["whole_check"]["max_abs_diff"] <= 1e-4
    assert (measured[["unfused_s", "fused_s", "compile_s"]] > 0).all().all()
    assert (measured["kernels_fused"] >= 1).all()
    assert (tmp_path / "results/plots/small_cnn/cpu/fuse_inductor.png").stat().st_size > 10_000
