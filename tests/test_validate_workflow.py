"""The validate rule as Snakemake runs it: a faithful plan passes, a wrong one is failed and listed, a
corrupt plan file stops the rule with a clear message; the tiny study's CPU plans recompute only and say
when their budget was raised."""

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
#: a CPU standing in for an accelerator that swaps (host memory declared separate): the plans here swap
DEVICE = "cpu_separate"

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
    """A copy of the tiny study (small_cnn's export kept: file times kept, it does not rerun) with two plans
    written where the balance rule would put them, on a device with separate host memory (small_cnn profiled
    for it), at budgets the tiny study does not plan."""
    built = build_model("small_cnn", SMALL_CNN, seed=0)
    traced, _ = trace_training_step(built)
    tables = graph_tables(traced)
    names = [tables.nodes.name.tolist()]
    work = copy_of_study(tiny_study, tmp_path_factory.mktemp("validate") / "w")
    config = yaml.safe_load(TINY.read_text())
    devices = {**config["devices"], DEVICE: {**config["devices"]["cpu"], "host_memory": "separate"}}
    config.update(device=DEVICE, devices=devices, study={"plan": ["small_cnn"], "overflow": [], "layout": []},
                  budgets=[0.7, 0.5],
                  validate={"repeats": 1, "warmup": 0, "threads": 1,
                            "tolerances": {"time_rel": 1.0e9, "load_rel": 1.0e9}})
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(work, f"results/profile/small_cnn/{DEVICE}/summary.json", rules=("export", "profile"))
    assert out.returncode == 0, out.stderr[-4000:]
    plans = {"0.7": plan_for(tables, names, swap_and_recompute), "0.5": _wrong(plan_for(tables, names, no_recompute))}
    for budget, plan in plans.items():
        plan["budget_fraction"] = float(budget)
        path = work / f"results/balance/small_cnn/{DEVICE}/k1/b{budget}/plan.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(plan))
    out = snakemake(work, "results/validate/summary.csv", f"results/plots/small_cnn/{DEVICE}/k1/b0.7/validation.png")
    assert out.returncode == 0, out.stderr[-4000:]
    return work


def test_failed_plan_is_reported_not_fatal(workdir):
    good = json.loads((workdir / f"results/validate/small_cnn/{DEVICE}/k1/b0.7/validation.json").read_text())
    bad = json.loads((workdir / f"results/validate/small_cnn/{DEVICE}/k1/b0.5/validation.json").read_text())
    assert good["status"] == "passed", good["reasons"]
    assert good["gradients"]["vs_compiled_step"]["bit_exact"]
    assert good["memory_model"]["host_memory"] == "separate" and good["memory"]["counted"] == "peak_bytes_allocator"
    wrong_op = json.loads((workdir / f"results/balance/small_cnn/{DEVICE}/k1/b0.5/plan.json").read_text())["wrong_op"]
    assert bad["status"] == "failed" and any(f"'{wrong_op}'" in r for r in bad["reasons"])
    summary = pd.read_csv(workdir / "results/validate/summary.csv")
    assert summary.set_index("budget_fraction").status.to_dict() == {0.7: "passed", 0.5: "failed"}
    assert wrong_op in summary.set_index("budget_fraction").loc[0.5, "reasons"]
    timeline = pd.read_parquet(workdir / f"results/validate/small_cnn/{DEVICE}/k1/b0.7/timeline.parquet")
    assert len(timeline) == good["stages"][0]["events"] and (timeline.kind == "swap_in").any()
    assert (workdir / f"results/plots/small_cnn/{DEVICE}/k1/b0.7/validation.png").stat().st_size > 0


def test_corrupt_plan_stops_the_rule_with_a_clear_message(workdir):
    plan = workdir / f"results/balance/small_cnn/{DEVICE}/k1/b0.3/plan.json"
    plan.parent.mkdir(parents=True)
    plan.write_text('{"stages": [{"nodes": []')
    out = snakemake(workdir, f"results/validate/small_cnn/{DEVICE}/k1/b0.3/validation.json")
    assert out.returncode != 0
    log = (workdir / f"logs/validate/small_cnn/{DEVICE}/k1/b0.3.log").read_text()
    assert "PlanError" in log and "corrupt JSON artifact" in log and str(plan.name) in log


def test_the_tiny_study_cpu_plans_recompute_only_and_a_raised_budget_says_raised(tiny_study):
    """The tiny study's CPU (host memory shared by default): no stage problem lets an op swap, and every artifact
    says so; tiny GPT-2's 0.6 budget is below what any recompute-only schedule reaches (its gradients peak at the
    end of backward), and its plan reads raised in every place a status appears, never feasible."""
    base = "tiny_gpt2/cpu/k1/b0.6"
    schedules = json.loads((tiny_study / f"results/schedule/{base}/schedules.json").read_text())
    plan = json.loads((tiny_study / f"results/balance/{base}/plan.json").read_text())
    validation = json.loads((tiny_study / f"results/validate/{base}/validation.json").read_text())
    for doc in (schedules, plan, validation):
        assert doc["memory_model"]["host_memory"] == "shared" and not doc["memory_model"]["swaps"]
        assert not any(op["swap"] for st in doc.get("stages", []) if "problem" in st for op in st["problem"]["ops"])
    sched = plan["stages"][0]["schedule"]
    assert plan["stages"][0]["status"] == sched["status"] == schedules["stages"][0]["schedule"]["status"] == "raised"
    assert sched["budget_bytes"] > sched["requested_budget_bytes"] == plan["stages"][0]["problem"]["budget_bytes"]
    assert sched["budget_status"] in ("proven_infeasible", "not_found")
    stage = validation["stages"][0]
    assert (stage["schedule_status"], stage["budget_status"]) == ("raised", sched["budget_status"])
    assert stage["requested_budget_bytes"] == sched["requested_budget_bytes"] < stage["budget_bytes"]
    assert validation["memory"]["counted"] == "peak_bytes_process" and validation["memory"]["peak_bytes_process"] > 0
    assert validation["memory"]["budget_respected"] and stage["budget_respected"], validation["reasons"]
    summary = pd.read_csv(tiny_study / "results/validate/summary.csv")
    row = summary[(summary.model == "tiny_gpt2") & (summary.budget_fraction == 0.6)].iloc[0]
    assert (row.schedule_status, row.host_memory, row.budget_status) == ("raised", "shared", sched["budget_status"])
    compare = pd.read_csv(tiny_study / f"results/schedule/{base}/compare.csv")
    assert "feasible" not in set(compare[compare.method == "ours"].status)
