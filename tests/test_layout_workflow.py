"""The layout rules as Snakemake runs them on a tiny CNN: measured problem, exact plan, executed plans with
gradients checked, I/O table with simulated dataflow, summary and figures."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import SMALL_CNN
from trainplan.layout import plan_time, problem_from_dict

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.workflow


def _macs(convs: pd.DataFrame) -> pd.Series:
    return convs.out_shape.map(math.prod) * convs.weight_shape.map(lambda w: math.prod(w[1:]))


def _side(convs: pd.DataFrame) -> pd.Series:
    return convs.in_shape.map(lambda s: max(s[2:]))


def test_layout_rules_on_a_tiny_cnn(tmp_path):
    config = {
        "seed": 0, "device": "cpu", "devices": {"cpu": {"type": "cpu", "memory_gib": 1.0, "host_link_gbytes_per_s": 16.0}},
        "models": {"small_cnn": {**SMALL_CNN, "kwargs": {"channels": 16}}},
        "study": {"plan": ["small_cnn"], "layout": ["small_cnn"]}, "budgets": [0.7], "stages": [1],
        "layout": {"image_size": 32, "repeats": 1, "warmup": 0, "step_repeats": 1,
                   "sweep": {"shapes": 12, "max_macs": 1.0e6}, "io": {"fast_memory": [600], "simulate_steps": 5000}},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    targets = ["results/layout/cpu/summary.csv", "results/plots/layout/small_cnn/cpu/layout.png"]
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
           "--configfile", str(tmp_path / "config.yaml"), "--cores", "2", "--", *targets]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    base = tmp_path / "results/layout/small_cnn/cpu"
    plan = yaml.safe_load((base / "plan.json").read_text())
    problem = problem_from_dict(plan["problem"])
    assert plan["status"] == "optimal" and plan["time"] == pytest.approx(plan_time(problem, plan["layouts"]), rel=1e-12)
    for name, other in plan["baselines"].items():
        assert other["time"] >= plan["time"] * (1 - 1e-9), name
    execution = yaml.safe_load((base / "execution.json").read_text())
    assert execution["gradients_ok"] and execution["configs"]["planned"]["measured_step_s"] > 0
    low, high = execution["speedup_vs_best_single_ci95"]
    assert low <= high and execution["planned_faster_than_best_single"] == (low > 1.0)
    adopted = execution["adopted"]
    assert adopted["config"] == ("planned" if low > 1.0 else execution["measured_best_single"])
    assert plan["adopted"]["config"] == adopted["config"]
    assert plan["adopted"]["layouts"] == (plan["layouts"] if low > 1.0 else
                                          plan["baselines"][adopted["config"]]["layouts"])
    if sys.platform.startswith("linux"):  # timed with freed host memory kept, as the profile is (trainplan.timing)
        assert execution["host_allocator"].startswith("glibc malloc keeps freed memory")
        measured = yaml.safe_load((base / "problem.json").read_text())
        assert measured["meta"]["host_allocator"] == execution["host_allocator"]
    io = pd.read_csv(base / "io.csv")
    sim = io.dropna(subset=["simulated_io"])
    assert len(sim) == 2 and (sim.simulated_io == sim.exact_io).all() and (sim.simulated_io >= sim.bound).all()
    summary = pd.read_csv(tmp_path / "results/layout/cpu/summary.csv")
    assert summary.model.tolist() == ["small_cnn"] and summary.gradients_ok.all()
    # convs beyond the sweep (max_macs 1e6 here): more multiply-adds or a larger side than every timed sweep shape
    sweep = pd.read_parquet(tmp_path / "results/layout/sweep/cpu/sweep.parquet")
    sweep, convs = sweep[sweep.error.fillna("") == ""], pd.read_parquet(base / "convs.parquet")
    beyond = int(((_macs(convs) > _macs(sweep).max()) | (_side(convs) > _side(sweep).max())).sum())
    assert beyond >= 1 and execution["predictor"]["outside_sweep"] == beyond == summary.predictor_outside_sweep[0]
    assert (tmp_path / targets[1]).stat().st_size > 10_000
