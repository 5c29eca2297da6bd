"""The alignment stage as Snakemake runs it on the tiny study: artifacts parse and agree, reruns are exact."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import yaml
from workflow_run import TINY, snakemake

TARGETS = ["results/align/study.csv", "results/plots/align/align.png"]

pytestmark = pytest.mark.workflow


def test_artifacts(tiny_study):
    """The tiny study's alignment stage (proved at granularity 32)."""
    workdir = tiny_study
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


def test_cached_and_granularity_or_matmul_rule_reruns_plan(tiny_study, tmp_path):
    """Nothing to do on a finished study; a new granularity or matmul rule reruns the plan, the proof and the
    report, nothing upstream. (What the tensor-core rule pads is checked in-process: test_align_step.py.)"""
    workdir, config = tiny_study, TINY
    out = snakemake(workdir, config, "--dry-run", *TARGETS)
    assert "Nothing to be done" in out.stdout + out.stderr
    for change in ({"granularity_bytes": 16}, {"matmul_rule": "tensor_core"}):
        cfg = yaml.safe_load(config.read_text())
        cfg["align"].update(change)
        changed = tmp_path / "changed.yaml"
        changed.write_text(yaml.safe_dump(cfg))
        out = snakemake(workdir, changed, *TARGETS, "--dry-run", "--quiet", "rules")  # --quiet takes several values: targets first
        assert out.returncode == 0, out.stderr[-2000:]
        jobs = {m.group(1) for line in (out.stdout + out.stderr).splitlines()
                if (m := re.fullmatch(r"(\w+)\s+\d+", line.strip()))}
        assert {"align", "align_prove", "align_report"} <= jobs and "export" not in jobs, (change, jobs)
