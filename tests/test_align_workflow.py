"""The alignment stage as Snakemake runs it on the tiny study: artifacts parse and agree, reruns are exact."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from workflow_run import copy_of_study

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "config" / "config.yaml"
TARGETS = ["results/align/study.csv", "results/plots/align/align.png"]

pytestmark = pytest.mark.workflow


def snakemake(workdir: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(config), "--cores", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)


@pytest.fixture(scope="module")
def run(tiny_study, tmp_path_factory) -> tuple[Path, Path]:
    """A copy of the tiny study (its exports and overflow loop kept: file times kept, they do not rerun), the
    alignment stage rerun there at granularity 32."""
    workdir = copy_of_study(tiny_study, tmp_path_factory.mktemp("align") / "w")
    cfg = yaml.safe_load(TINY.read_text())
    cfg["align"] = {"prove_granularities": [32], "repeats": 2}
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = snakemake(workdir, config, *TARGETS)
    assert out.returncode == 0, out.stderr[-4000:]
    return workdir, config


def test_artifacts(run):
    workdir, _ = run
    study = pd.read_csv(workdir / "results/align/study.csv")
    assert sorted(study.model) == ["small_cnn", "tiny_gpt2"]
    for model in study.model:
        plan = json.loads((workdir / f"results/align/{model}/plan.json").read_text())
        ops = pd.read_parquet(workdir / f"results/align/{model}/ops.parquet")
        summary = json.loads((workdir / f"results/align/{model}/summary.json").read_text())
        assert len(plan["ops"]) == len(ops) == summary["ops"] > 20
        assert summary["pad_bytes"] == ops.pad_bytes.sum() <= ops.naive_pad_bytes.sum() == summary["naive_pad_bytes"]
        assert summary["tensors_aligned_after"] == summary["tensors"] and summary["never_more_than_naive_per_op"]
        assert (ops["class"] != "naive").all()
        proof = pd.read_parquet(workdir / f"results/align/{model}/proof.parquet")
        steps = json.loads((workdir / f"results/align/{model}/steps.json").read_text())["steps"]
        assert proof.within_tolerance.all() and all(s["within_fp16_roundoff"] for s in steps)
    cnn = study.set_index("model").loc["small_cnn"]
    assert cnn.proof_padded_ops > 0  # at g = 32 the CNN's 8 channels need a pad


def test_cached_and_granularity_reruns_plan(run, tmp_path):
    workdir, config = run
    out = snakemake(workdir, config, "--dry-run", *TARGETS)
    assert "Nothing to be done" in out.stdout + out.stderr
    cfg = yaml.safe_load(config.read_text())
    cfg["align"]["granularity_bytes"] = 16
    changed = tmp_path / "g16.yaml"
    changed.write_text(yaml.safe_dump(cfg))
    out = snakemake(workdir, changed, *TARGETS, "--dry-run", "--quiet", "rules")  # --quiet takes several values: targets first
    assert out.returncode == 0, out.stderr[-2000:]
    jobs = {m.group(1) for line in (out.stdout + out.stderr).splitlines() if (m := re.fullmatch(r"(\w+)\s+\d+", line.strip()))}
    assert {"align", "align_prove", "align_report"} <= jobs and "export" not in jobs


def test_the_tensor_core_rule_replans_and_pads_more(run, tmp_path):
    """align.matmul_rule: tensor_core reruns the plan and the proof; at g = 128 (q = 64) tiny GPT-2's 32 tokens
    are the only unaligned matmul dimension, which the seed's rule leaves alone (the 64-wide rows are aligned)
    and the tensor-core rule pads; the padded steps stay within fp16 round-off. (Runs last: it alters the study.)"""
    workdir, config = run
    summaries = {}
    for rule in ("dma", "tensor_core"):
        cfg = yaml.safe_load(config.read_text())
        cfg["align"].update(granularity_bytes=128, prove_granularities=[128], matmul_rule=rule)
        changed = tmp_path / f"{rule}.yaml"
        changed.write_text(yaml.safe_dump(cfg))
        out = snakemake(workdir, changed, "results/align/tiny_gpt2/summary.json", "results/align/tiny_gpt2/steps.json")
        assert out.returncode == 0, out.stderr[-2000:]
        summaries[rule] = json.loads((workdir / "results/align/tiny_gpt2/summary.json").read_text())
        steps = json.loads((workdir / "results/align/tiny_gpt2/steps.json").read_text())["steps"]
        assert summaries[rule]["matmul_rule"] == rule
        assert all(s["matmul_rule"] == rule and s["within_fp16_roundoff"] for s in steps), steps
    assert summaries["tensor_core"]["pad_bytes"] > summaries["dma"]["pad_bytes"]
    assert summaries["tensor_core"]["tensors_aligned_after"] == summaries["tensor_core"]["tensors"]
