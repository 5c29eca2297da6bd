"""The partition, balance and plot_balance rules through Snakemake, on a synthetic profiled graph."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_partition_graph import training_graph

from trainplan.io import write_json, write_table

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.workflow
CONFIG = {
    "seed": 0, "device": "cpu",
    "devices": {"cpu": {"type": "cpu", "memory_gib": 1.0, "host_link_gbytes_per_s": 0.001}},
    "models": {"syn": {"source": "callable", "callable": "trainplan.zoo:small_cnn"}},
    "study": {"plan": ["syn"]},
    "budgets": [0.5], "stages": [2],
    "solver": {"time_limit_s": 0.5, "workers": 1, "seed": 0},
    "balance": {"threshold": 0.99, "max_iterations": 3, "micro_batches": 4, "tolerance": 0.05},
}


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "snakemake", *args, "--snakefile", str(REPO / "Snakefile"), "--directory",
           str(workdir), "--configfile", str(workdir / "config.yaml"), "--cores", "1",
           "--allowed-rules", "partition", "balance", "plot_balance"]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A study folder holding a synthetic 'exported' and 'profiled' model, written in dependency order."""
    root = tmp_path_factory.mktemp("partition")
    (root / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    nodes, tensors = training_graph(16, seed=7)
    write_table(root / "results/export/syn/cpu/nodes.parquet", nodes.drop(columns="time_s"))
    write_table(root / "results/export/syn/cpu/tensors.parquet", tensors)
    write_json(root / "results/export/syn/cpu/graph.json", {"model": "syn"})
    write_table(root / "results/profile/syn/cpu/ops.parquet",
                nodes[["node_id", "name", "phase", "time_s"]].assign(recompute_s=nodes.time_s, transfer_s=0.0,
                                                                  workspace_measured_bytes=0))
    write_json(root / "results/profile/syn/cpu/summary.json", {"model": "syn", "host_link_bytes_per_s": 1e6,
                                                               "host_link": {"source": "config"}})
    return root


TARGET = "results/plots/syn/cpu/k2/b0.5/balance.png"


def test_rules_write_the_plan(workdir):
    out = snakemake(workdir, TARGET)
    assert out.returncode == 0, out.stderr[-3000:]
    part = json.loads((workdir / "results/partition/syn/cpu/k2/partition.json").read_text())
    plan = json.loads((workdir / "results/balance/syn/cpu/k2/b0.5/plan.json").read_text())
    iters = json.loads((workdir / "results/balance/syn/cpu/k2/b0.5/iterations.json").read_text())
    assert (plan["model"], plan["device"], plan["k"], plan["budget_fraction"]) == ("syn", "cpu", 2, 0.5)
    assert part["k"] == 2 and [s["index"] for s in part["stages"]] == [0, 1]
    assert iters["iterations"][0]["cuts"] == part["cuts"]
    assert plan["cuts"] == iters["iterations"][plan["balance"]["chosen_iteration"]]["cuts"]
    assert all(s["schedule"]["events"] and s["problem"]["budget_bytes"] for s in plan["stages"])
    assert (workdir / TARGET).stat().st_size > 0
    assert (workdir / "logs/balance/syn/cpu/k2/b0.5.log").exists()


def test_changing_a_balance_param_reruns_only_balance(workdir):
    cfg = yaml.safe_load((workdir / "config.yaml").read_text())
    cfg["balance"]["threshold"] = 0.5
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    out = snakemake(workdir, "--dry-run", TARGET)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert "rule balance:" in text and "rule partition:" not in text
