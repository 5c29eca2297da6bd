"""The memory/time frontier (trainplan.frontier): method names parsed or refused by name, dominance judged on
both axes, and the workflow's frontier rule on the tiny study: every method measured in its own process on one
meter, the plan's point below eager's peak, the figure in the report."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.conftest import SMALL_CNN
from trainplan.budget import BudgetError
from trainplan.frontier import worker
from trainplan.frontier.method_names import Method, MethodError
from trainplan.frontier.methods import prepare
from trainplan.frontier.run import FrontierSettings, run_method, summarize, verdicts
from trainplan.models import build_model

MODEL = "tiny_gpt2_b4"  # tests/config/config.yaml's study.frontier


@pytest.mark.parametrize("text", ["eager", "hf_checkpointing", "compile@0.3", "compile+exact@1", "trainplan@0.5",
                                  "trainplan+opt@2GiB", "trainplan+fused@0.5", "trainplan+opt+fused@1GiB", "sac@0.6",
                                  "sac+compile@1500MB"])
def test_methods_parse_and_print_back(text):
    assert str(Method.parse(text)) == text


@pytest.mark.parametrize("text, error, match", [
    ("eager@0.5", MethodError, "eager@0.5"), ("rockmate@0.5", MethodError, "rockmate"),
    ("compile@1.5", MethodError, r"\[0, 1\]"), ("trainplan", MethodError, "trainplan"),
    ("trainplan@2GX", BudgetError, "GX")])
def test_bad_methods_are_refused_by_name(text, error, match):
    with pytest.raises(error, match=match):
        Method.parse(text)


def test_a_competitor_is_dominated_only_on_both_axes():
    rows = [{"model": "m", "method": "eager", "peak_mib": 10.0, "step_s": 1.0},
            {"model": "m", "method": "compile@1.0", "peak_mib": 8.0, "step_s": 0.5},
            {"model": "m", "method": "trainplan@0.5", "peak_mib": 6.0, "step_s": 0.9},
            {"model": "other", "method": "sac@0.5", "peak_mib": 1.0, "step_s": 0.1},
            {"model": "m", "method": "hf_checkpointing", "error": "no support"}]
    assert {v["method"]: v["dominated_by"] for v in verdicts(rows)} == {"eager": "trainplan@0.5", "compile@1.0": None}


def test_compiling_takes_no_update_so_every_method_measures_the_same_step(tmp_path):
    """A compiled method's setup compiles forward and backward without an optimizer step: after as many steps as
    eager, its loss is eager's (within Inductor's round-off), not one update further on."""
    losses = {}
    for text in ("eager", "compile@1.0"):
        prepared = prepare(build_model("small_cnn", SMALL_CNN, seed=0), Method.parse(text), cache=tmp_path,
                           time_limit_s=5.0)
        losses[text] = [prepared.step() for _ in range(3)]
    assert losses["compile@1.0"] == pytest.approx(losses["eager"], rel=1e-4)
    assert len(set(losses["eager"])) == 3  # each step updated the weights


def test_the_fused_plan_with_the_optimizer_in_it_trains_as_eager(tmp_path):
    """``trainplan+opt+fused``: the plan made on the model whose forward groups run as Inductor-compiled ops, each
    parameter updated by the method's AdamW in backward: three steps' losses are eager's (within Inductor's
    round-off), and the fused module's parameters are the model's own, so the updates reach it."""
    losses, facts = {}, {}
    for text in ("eager", "trainplan+opt+fused@0.8"):
        built = build_model("small_cnn", SMALL_CNN, seed=0)
        prepared = prepare(built, Method.parse(text), cache=tmp_path, time_limit_s=5.0)
        losses[text] = [prepared.step() for _ in range(3)]
        facts[text] = prepared.facts
    assert facts["trainplan+opt+fused@0.8"]["fused_groups"] > 0
    assert losses["trainplan+opt+fused@0.8"] == pytest.approx(losses["eager"], rel=1e-4)
    assert len(set(losses["eager"])) == 3  # each step updated the weights


def test_the_bytes_held_outside_the_step_count_the_optimizer_state_only_where_the_plan_holds_it(tmp_path):
    """A plan's byte budget counts parameters, buffers and batch; the optimizer's state only with the optimizer in
    the plan (``+opt``): the others' over-budget check must not charge them AdamW's moments."""
    held = {}
    for text in ("trainplan@0.6", "trainplan+opt@0.6"):
        built = build_model("small_cnn", SMALL_CNN, seed=0)
        prepared = prepare(built, Method.parse(text), cache=tmp_path, time_limit_s=5.0)
        prepared.step()  # AdamW's state exists after the first step
        params = sum(p.numel() * p.element_size() for p in built.module.parameters())
        held[text] = prepared.held(), params
    (plain, params), (with_opt, _) = held["trainplan@0.6"], held["trainplan+opt@0.6"]
    assert with_opt - plain >= 2 * params  # exp_avg and exp_avg_sq, one parameter's size each


def test_a_worker_meters_with_freed_memory_returned_and_times_in_a_kept_heap(tmp_path):
    """The peak needs resident memory to track live bytes; the time is taken as a caching allocator would see it
    (freed pages reused), else every allocation's page faults charge plans that free and re-allocate."""
    (run,) = run_method("small_cnn", SMALL_CNN, "eager", FrontierSettings(repeats=2, time_limit_s=4.0), tmp_path)
    assert "error" not in run, run
    assert run["host_allocator"]["metering"].startswith("glibc malloc returns freed memory")
    assert run["host_allocator"]["preparing"].startswith("glibc malloc keeps freed memory")
    assert run["host_allocator"]["timing"].startswith("glibc malloc keeps freed memory")
    assert len(run["step_s"]) == len(run["peak_bytes"]) == len(run["losses"]) == len(run["timed_minor_faults"]) == 2
    settle = run["settle_minor_faults"]  # warmed in the kept heap until a step maps (almost) no new pages
    assert 2 <= len(settle) <= 2 + worker.SETTLE_MAX  # at least the two warm-up steps of FrontierSettings
    assert settle[-1] < worker.STEADY_FAULTS or len(settle) == 2 + worker.SETTLE_MAX
    assert all(t > 0 for t in run["step_s"]) and all(p > 0 for p in run["peak_bytes"])
    assert all(0 < b <= p for b, p in zip(run["backward_peak_bytes"], run["peak_bytes"]))  # read at backward's end


@pytest.mark.workflow
def test_the_frontier_rule_measures_every_method_on_one_meter(tiny_study):
    table = pd.read_csv(tiny_study / "results" / "frontier" / MODEL / "cpu" / "frontier.csv").set_index("method")
    assert list(table.index) == ["eager", "trainplan@0.6", "sac@0.6"]
    assert "error" not in table or table["error"].isna().all()
    assert (table.processes == 1).all() and (table.peak_mib > 0).all() and (table.step_s > 0).all()
    assert table.loss.nunique() == 1  # the same model and batch: the same first loss under every method
    plan = table.loc["trainplan@0.6"]
    assert plan.plan_status == "met" and plan.peak_mib < table.loc["eager", "peak_mib"]
    export = json.loads(table.loc["sac@0.6", "sac"])
    assert export["regions"] == 2 and export["calls"]["MUST_RECOMPUTE"] > 0 and not export["unmatched"]
    found = json.loads((tiny_study / "results" / "frontier" / MODEL / "cpu" / "verdicts.json").read_text())
    assert [v["method"] for v in found["verdicts"]] == ["eager"]  # the competitors: ours are not judged
    assert (tiny_study / "results" / "plots" / MODEL / "cpu" / "frontier.png").stat().st_size > 10_000


def test_a_plan_is_checked_against_its_budget_over_the_phases_it_plans():
    """A plan without the optimizer budgets forward and backward: its over-budget check reads the peak at the end
    of backward (the optimizer step's temporaries after it are not in its plan); a plan with the optimizer (+opt)
    budgets the whole step."""
    mib = 2**20

    def run(method: str) -> dict:
        return {"model": "m", "method": method, "step_s": [1.0], "peak_bytes": [100 * mib],
                "backward_peak_bytes": [60 * mib], "losses": [1.0], "setup_s": 1.0, "held_bytes": 10 * mib,
                "planned_budget_bytes": 80 * mib}

    plain, with_opt = summarize([run("trainplan@0.5")]), summarize([run("trainplan+opt@0.5")])
    assert plain["backward_peak_mib"] == with_opt["backward_peak_mib"] == 60
    assert plain["over_budget_mib"] == -10 and with_opt["over_budget_mib"] == 30
