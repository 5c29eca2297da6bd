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
from workflow_run import copy_of_study

from trainplan.precision.policy import load_policy

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = REPO / "tests" / "config" / "config.yaml"
TINY_STUDY = yaml.safe_load(TINY_CONFIG.read_text())
TINY = TINY_STUDY["models"]["tiny_gpt2"]
TARGETS = ["results/overflow/study.csv", "results/plots/overflow/overflow.png"]

pytestmark = pytest.mark.workflow


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(TINY_CONFIG), "--cores", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)


@pytest.fixture(scope="module")
def run(tiny_study, tmp_path_factory) -> tuple[Path, list[str]]:
    """A copy of the tiny study, whose overflow loop on tiny_gpt2 has two injected roots: the forward addmm of
    h.1.mlp.c_fc and the backward mm of h.0.attn.c_attn (found here in the traced step, independently of the
    node names the config gives)."""
    traced, _ = traced_case("tiny_gpt2", TINY)
    injected = TINY_STUDY["overflow"]["inject"]["tiny_gpt2"]
    roots = [i["node"] for i in injected]
    assert roots[0] in op_nodes(traced, "aten.addmm.default", "h.1.mlp.c_fc", "forward")
    assert roots[1] in op_nodes(traced, "aten.mm.default", "h.0.attn.c_attn", "backward")
    assert all(i["scale"] == 2.0**40 for i in injected)
    workdir = copy_of_study(tiny_study, tmp_path_factory.mktemp("overflow") / "w")
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
