"""The overflow stage as Snakemake runs it: one cached checkpoint job per S1-S3 pass, parsed artifacts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from overflow_cases import op_nodes, traced_case

from trainplan.precision.policy import load_policy

REPO = Path(__file__).resolve().parents[1]
TINY = {
    "architecture": "GPT2LMHeadModel",
    "config": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512, "n_positions": 64},
    "inputs": {"batch_size": 2, "seq_len": 16},
}
TARGETS = ["results/overflow/study.csv", "results/plots/overflow/overflow.png"]

pytestmark = pytest.mark.workflow


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "config.yaml"), "--cores", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, list[str]]:
    traced, _ = traced_case("tiny_gpt2", TINY)
    roots = [op_nodes(traced, "aten.addmm.default", "h.1.mlp.c_fc", "forward")[0],
             op_nodes(traced, "aten.mm.default", "h.0.attn.c_attn", "backward")[0]]
    workdir = tmp_path_factory.mktemp("overflow")
    (workdir / "config").mkdir()
    (workdir / "config" / "precision_policy.yaml").write_text((REPO / "config" / "precision_policy.yaml").read_text())
    config = {
        "seed": 0, "device": "cpu", "devices": {"cpu": {"type": "cpu", "memory_gib": 1.0, "host_link_gbytes_per_s": 16.0}},
        "models": {"tiny_gpt2": TINY}, "study": {"plan": ["tiny_gpt2"], "overflow": ["tiny_gpt2"]},
        "budgets": [0.6], "stages": [1],
        "overflow": {"max_iterations": 5, "repeats": 1, "warmup": 0,
                     "inject": {"tiny_gpt2": [{"node": r, "scale": 2.0**40} for r in roots]}},
    }
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(workdir, *TARGETS)
    assert out.returncode == 0, out.stderr[-4000:]
    return workdir, roots


def test_iteration_artifacts_and_summary(run):
    workdir, roots = run
    base = workdir / "results/overflow/tiny_gpt2"
    passes = sorted(base.glob("iter*/findings.json"))
    docs = [json.loads(p.read_text()) for p in passes]
    assert [d["iteration"] for d in docs] == [0, 1, 2]
    assert [d["roots"] for d in docs] == [[roots[0]], [roots[1]], []]
    assert [d["converged"] for d in docs] == [False, False, True]
    assert load_policy(base / "iter2/policy_next.yaml").deny_nodes == tuple(roots)
    summary = json.loads((base / "summary.json").read_text())
    assert summary["injection"]["precision"] == summary["injection"]["recall"] == 1.0
    assert summary["iterations"] == 3 and summary["converged"]
    shares = {k: v["fp16_flop_share"] for k, v in summary["shares"].items()}
    assert shares["default"] >= shares["autocast"] and shares["final"] >= shares["autocast_denied"]
    precision = pd.read_parquet(base / "precision.parquet")
    assert set(precision.loc[precision.list_final == "deny", "name"]) >= set(roots)
    findings = pd.read_parquet(base / "findings.parquet")
    assert set(findings.loc[findings.is_root, "node"]) == set(roots)
    table = pd.read_csv(workdir / "results/overflow/study.csv")
    assert table.loc[0, "n_denied"] == 2 and table.loc[0, "injection_recall"] == 1.0


def test_rerun_is_a_noop(run):
    workdir, _ = run
    dry = snakemake(workdir, "--dry-run", *TARGETS)
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr
