"""The validate rule as Snakemake runs it: a faithful plan passes, a wrong one is failed and listed, a
corrupt plan file stops the rule with a clear message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from workflow_run import copy_of_study

from tests.conftest import SMALL_CNN
from tests.test_execute import no_recompute, plan_for, swap_and_recompute
from trainplan.export.tables import graph_tables
from trainplan.export.trace import trace_training_step
from trainplan.models import build_model
from trainplan.schedule import problem_from_dict, replay

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "config" / "config.yaml"
RULES = ["validate", "plot_validate", "validate_summary"]  # the plans are given here, not balanced

pytestmark = pytest.mark.workflow


def snakemake(workdir: Path, *args: str, rules: tuple[str, ...] = tuple(RULES)) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "config.yaml"), "--cores", "2", "--allowed-rules", *rules, "--", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)


def _wrong(plan: dict) -> dict:
    """The plan with its largest op believed 100x smaller (time and peak re-replayed, so it is self-consistent)."""
    stage = plan["stages"][0]
    victim = max(stage["problem"]["ops"], key=lambda o: o["bytes"])
    victim["bytes"] //= 100
    rep = replay(problem_from_dict(stage["problem"]), [tuple(e) for e in stage["schedule"]["events"]])
    stage["schedule"].update(time=rep.time, peak_bytes=rep.peak_bytes, budget_bytes=rep.peak_bytes)
    plan["wrong_op"] = victim["id"]
    return plan


@pytest.fixture(scope="module")
def workdir(tiny_study, tmp_path_factory) -> Path:
    """A copy of the tiny study (small_cnn's export and profile kept: file times kept, they do not rerun) with two
    plans written where the balance rule would put them, at budgets the tiny study does not plan."""
    built = build_model("small_cnn", SMALL_CNN, seed=0)
    traced, _ = trace_training_step(built)
    tables = graph_tables(traced)
    names = [tables.nodes.name.tolist()]
    work = copy_of_study(tiny_study, tmp_path_factory.mktemp("validate") / "w")
    config = yaml.safe_load(TINY.read_text())
    config.update(study={"plan": ["small_cnn"], "overflow": [], "layout": []}, budgets=[0.7, 0.5],
                  validate={"repeats": 1, "warmup": 0, "threads": 1,
                            "tolerances": {"time_rel": 1.0e9, "load_rel": 1.0e9}})
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(work, "results/profile/small_cnn/cpu/summary.json", rules=("export", "profile"))
    assert out.returncode == 0, out.stderr[-4000:]
    plans = {"0.7": plan_for(tables, names, swap_and_recompute), "0.5": _wrong(plan_for(tables, names, no_recompute))}
    for budget, plan in plans.items():
        plan["budget_fraction"] = float(budget)
        path = work / f"results/balance/small_cnn/cpu/k1/b{budget}/plan.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(plan))
    out = snakemake(work, "results/validate/summary.csv", "results/plots/small_cnn/cpu/k1/b0.7/validation.png")
    assert out.returncode == 0, out.stderr[-4000:]
    return work


def test_failed_plan_is_reported_not_fatal(workdir):
    good = json.loads((workdir / "results/validate/small_cnn/cpu/k1/b0.7/validation.json").read_text())
    bad = json.loads((workdir / "results/validate/small_cnn/cpu/k1/b0.5/validation.json").read_text())
    assert good["status"] == "passed", good["reasons"]
    assert good["gradients"]["vs_compiled_step"]["bit_exact"]
    wrong_op = json.loads((workdir / "results/balance/small_cnn/cpu/k1/b0.5/plan.json").read_text())["wrong_op"]
    assert bad["status"] == "failed" and any(f"'{wrong_op}'" in r for r in bad["reasons"])
    summary = pd.read_csv(workdir / "results/validate/summary.csv")
    assert summary.set_index("budget_fraction").status.to_dict() == {0.7: "passed", 0.5: "failed"}
    assert wrong_op in summary.set_index("budget_fraction").loc[0.5, "reasons"]
    timeline = pd.read_parquet(workdir / "results/validate/small_cnn/cpu/k1/b0.7/timeline.parquet")
    assert len(timeline) == good["stages"][0]["events"]
    assert (workdir / "results/plots/small_cnn/cpu/k1/b0.7/validation.png").stat().st_size > 0


def test_corrupt_plan_stops_the_rule_with_a_clear_message(workdir):
    plan = workdir / "results/balance/small_cnn/cpu/k1/b0.3/plan.json"
    plan.parent.mkdir(parents=True)
    plan.write_text('{"stages": [{"nodes": []')
    out = snakemake(workdir, "results/validate/small_cnn/cpu/k1/b0.3/validation.json")
    assert out.returncode != 0
    log = (workdir / "logs/validate/small_cnn/cpu/k1/b0.3.log").read_text()
    assert "PlanError" in log and "corrupt JSON artifact" in log and str(plan.name) in log
