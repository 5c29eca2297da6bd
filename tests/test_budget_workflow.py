"""Byte budgets through the workflow: small_cnn planned and validated at a fraction and at two byte budgets, one
met as requested and one below the least reachable budget, so raised (about 45 s alone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from workflow_run import TINY, copy_of_study, snakemake

from trainplan.budget import parse_budget

pytestmark = pytest.mark.workflow

#: small_cnn's stage (cpu, k=1) has 16 KiB fixed; with its convolutions' measured workspaces its least reachable
#: budget is about 232 KiB (storages weighed at their CPU allocation sizes): 260KiB is met as requested, 100KB is raised
MET, RAISED = "260KiB", "100KB"


@pytest.fixture(scope="module")
def study(tiny_study, tmp_path_factory) -> Path:
    """In a copy of the tiny study (small_cnn's export and profile kept: file times kept, they do not rerun)."""
    work = tmp_path_factory.mktemp("bytes")
    copy_of_study(tiny_study, work / "w")
    config = yaml.safe_load(TINY.read_text())
    config.update(study={"plan": ["small_cnn"], "overflow": [], "layout": []}, budgets=[0.5, MET, RAISED],
                  validate={"repeats": 1, "warmup": 0, "threads": 1,
                            "tolerances": {"time_rel": 1.0e9, "load_rel": 1.0e9}})
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    where = "small_cnn/cpu/k1"
    out = snakemake(work / "w", work / "config.yaml", f"results/validate/{where}/b{MET}/validation.json",
                    f"results/validate/{where}/b{RAISED}/validation.json", f"results/plots/{where}/b{MET}/validation.png",
                    f"results/plots/{where}/schedule_overhead.png")
    assert out.returncode == 0, out.stderr[-4000:]
    return work / "w" / "results"


def _read(results: Path, stage: str, budget: str, name: str) -> dict:
    return json.loads((results / stage / "small_cnn/cpu/k1" / f"b{budget}" / name).read_text())


def test_a_byte_budget_is_each_stages_cap_and_the_meter_checks_it(study):
    requested = parse_budget(MET).bytes
    plan = _read(study, "balance", MET, "plan.json")
    assert (plan["budget"], plan["budget_fraction"], plan["requested_budget_bytes"]) == ("260.00 KiB", None, requested)
    (stage,) = plan["stages"]
    assert stage["problem"]["budget_bytes"] == stage["budget_bytes"] == requested
    assert stage["schedule"]["status"] in ("optimal", "feasible") and stage["peak_bytes"] <= requested
    validation = _read(study, "validate", MET, "validation.json")
    assert validation["status"] == "passed" and validation["requested_budget_bytes"] == requested, validation["reasons"]
    (checked,) = validation["stages"]
    assert checked["budget_bytes"] == checked["requested_budget_bytes"] == requested
    assert checked["budget_respected"] and checked["counted_peak_bytes"] <= requested
    assert validation["memory"]["budget_respected"] and validation["memory"]["budget_bytes"] == requested


def test_a_byte_budget_below_the_least_reachable_one_is_raised_as_a_fraction_is(study):
    requested = parse_budget(RAISED).bytes
    (stage,) = _read(study, "balance", RAISED, "plan.json")["stages"]
    sched = stage["schedule"]
    assert (sched["status"], sched["requested_budget_bytes"]) == ("raised", requested)
    assert sched["budget_status"] in ("proven_infeasible", "not_found") and sched["budget_bytes"] > requested
    fraction = _read(study, "schedule", "0.5", "schedules.json")["stages"][0]["schedule"]
    assert fraction["status"] == "raised" and sched["budget_bytes"] == pytest.approx(fraction["budget_bytes"], rel=0.05)
    (checked,) = _read(study, "validate", RAISED, "validation.json")["stages"]
    assert (checked["schedule_status"], checked["requested_budget_bytes"]) == ("raised", requested)
    assert checked["budget_respected"] and checked["counted_peak_bytes"] <= checked["budget_bytes"] == sched["budget_bytes"]
