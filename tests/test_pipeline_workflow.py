"""The pipeline and plot_pipeline rules: tiny GPT-2's k=2 plan run as two torchrun processes under 1F1B through the
workflow (the artifact bit-identical to the single-process step, medians over the measured steps, the timeline and
the prediction with the measured send/receive; the figure), and which runs a study asks for (about 80 s alone)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from PIL import Image
from workflow_run import TINY, copy_of_study, snakemake

from trainplan.pipeline.report import holds_run

pytestmark = pytest.mark.workflow
WHERE = "tiny_gpt2/cpu/k2/b0.6"
PIPELINE = {"schedules": ["1f1b"], "micro_batches": [2], "threads": 1, "warmup": 1, "repeats": 2, "check": True,
            "methods": ["even_blocks", "ds_parameters"]}


def _config(work: Path, **changes) -> Path:
    """The tiny study on tiny GPT-2 alone at k=2, with ``changes`` on top."""
    config = yaml.safe_load(TINY.read_text())
    config.update({"study": {"plan": ["tiny_gpt2"], "overflow": [], "layout": [], "frontier": []}, "stages": [2],
                   "budgets": [0.6], "pipeline": PIPELINE, **changes})
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    return work / "config.yaml"


TARGETS = (f"results/pipeline/{WHERE}/1f1b_m2.json", f"results/plots/{WHERE}/pipeline_1f1b_m2.png",
           f"results/pipeline/{WHERE}/methods_1f1b_m2.csv", f"results/plots/{WHERE}/pipeline_methods_1f1b_m2.png")


@pytest.fixture(scope="module")
def study(tiny_study, tmp_path_factory) -> Path:
    """In a copy of the tiny study (tiny GPT-2's export and profile kept: file times kept, they do not rerun)."""
    work = tmp_path_factory.mktemp("pipeline")
    copy_of_study(tiny_study, work / "w")
    out = snakemake(work / "w", _config(work, pipeline={**PIPELINE, "schedules": ["1f1b", "gpipe"]}), *TARGETS)
    assert out.returncode == 0, out.stderr[-4000:]
    return work / "w"


def test_the_rule_runs_the_plan_as_a_pipeline_and_draws_each_rank(study):
    run = json.loads((study / "results/pipeline" / WHERE / "1f1b_m2.json").read_text())
    assert (run["k"], run["schedule"], run["micro_batches"], run["repeats"]) == (2, "1f1b", 2, 2)
    assert run["check"] == {"planned_bit_identical": True, "eager_close": True, "tied_reduced_close": True}
    assert run["tied_grads"] == "step"
    assert len(run["measured"]["step_s_repeats"]) == 2
    assert run["measured"]["step_s"] == pytest.approx(sorted(run["measured"]["step_s_repeats"])[0] / 2
                                                      + sorted(run["measured"]["step_s_repeats"])[1] / 2)
    pred = run["prediction"]
    assert pred["step_time_s"] == pytest.approx(3 * pred["t_max_s"])
    slots = [t + c for t, c in zip(pred["stage_times_s"], pred["comm_per_micro_batch_s"])]
    with_comm = pred["step_time_with_comm_s"]
    assert with_comm == pytest.approx(3 * max(slots) + pred["tied_reduce_s"]) and with_comm > pred["step_time_s"]
    for rank, actions in zip(run["ranks"], run["timeline"]["ranks"]):
        assert len(rank["step_s_repeats"]) == 2 and "actions_repeats" not in rank
        assert sorted((a["kind"], a["micro_batch"]) for a in actions) == [("B", 0), ("B", 1), ("F", 0), ("F", 1)]
        assert all(0 <= a["start_s"] < a["end_s"] <= run["timeline"]["step_s"] for a in actions)
    # the balance rule's plan (made for 1F1B with balance.micro_batches, 8) holds this run: run as it is
    plan = json.loads((study / "results/pipeline" / WHERE / "plan_1f1b_m2.json").read_text())
    balanced = json.loads((study / "results/balance" / WHERE / "plan.json").read_text())
    assert plan["cuts"] == balanced["cuts"] and plan["partition_method"] == "ours"
    assert all(m["planned_for_run"] for m in run["memory"])
    log = (study / "logs/pipeline" / WHERE / "1f1b_m2.log").read_text()
    assert "1f1b k=2 m=2" in log  # rank 0's line, from the torchrun ranks' output
    assert (study / "benchmarks/pipeline" / WHERE / "1f1b_m2.tsv").exists()
    assert (study / "results/plots" / WHERE / "pipeline_1f1b_m2.png").stat().st_size > 10_000


def test_the_methods_run_beside_ours_at_the_same_budget(study):
    table = pd.read_csv(study / "results/pipeline" / WHERE / "methods_1f1b_m2.csv").set_index("method")
    assert (table.measured_step_min_s <= table.measured_step_s).all()
    assert (table.measured_step_s <= table.measured_step_max_s).all()
    figure = Image.open(study / "results/plots" / WHERE / "pipeline_methods_1f1b_m2.png").info["Description"]
    assert all(f"{method}: measured" in figure for method in table.index)
    assert list(table.index) == ["even_blocks", "ds_parameters", "ours"]
    assert "error" not in table or table["error"].isna().all()
    assert (table.measured_step_s > 0).all() and (table.predicted_step_comm_s > table.predicted_step_s).all()
    for method, row in table.iterrows():  # a method whose cuts an earlier one has shares its run
        if isinstance(row.same_as, str):
            assert row.cuts == table.loc[row.same_as, "cuts"]
            assert row.measured_step_s == table.loc[row.same_as, "measured_step_s"]
        else:  # every method's ranks budgeted for what this run holds in flight (ours: the balance rule's plan,
            # made for 1F1B with m=8, holds 1F1B with m=2 at k=2)
            run = json.loads((study / "results/pipeline" / WHERE / "methods_1f1b_m2" / method / "run.json").read_text())
            assert all(m["planned_for_run"] for m in run["memory"])
            assert all(m["planned_for"] == {"schedule": "1f1b", "micro_batches": 8 if method == "ours" else 2,
                                            "stages_per_rank": 1} for m in run["memory"])


def test_a_run_the_balance_plan_does_not_hold_gets_a_plan_balanced_for_it(study):
    """GPipe holds every micro-batch in flight, the balance rule's 1F1B plan min(k - s, m): ours is balanced again
    for GPipe with the run's m, each rank's budget holding its m stashes."""
    target = f"results/pipeline/{WHERE}/plan_gpipe_m2.json"
    out = snakemake(study, study.parent / "config.yaml", target)
    assert out.returncode == 0, out.stderr[-4000:]
    plan = json.loads((study / target).read_text())
    assert "balancing for gpipe with m=2" in (study / "logs/pipeline_plan" / WHERE / "gpipe_m2.log").read_text()
    assert [st["problem"]["pipeline"]["schedule"] for st in plan["stages"]] == ["gpipe"] * 2
    assert [st["in_flight"] for st in plan["stages"]] == [2, 2]
    assert holds_run(plan["stages"], "gpipe", 2) == [True, True]
    balanced = json.loads((study / "results/balance" / WHERE / "plan.json").read_text())
    assert [st["in_flight"] for st in balanced["stages"]] == [2, 1]  # why it was not reused
    for st in plan["stages"]:  # each rank's peak with its 2 stashes within its budget, or the budget raised to it
        assert st["rank_peak_bytes"] <= st["rank_budget_bytes"] if st["rank_status"] == "met" else \
            st["rank_status"] == "raised" and st["rank_peak_bytes"] == st["rank_budget_bytes"]


def test_the_figure_is_in_the_report_under_pipeline(study):
    out = snakemake(study, study.parent / "config.yaml", "--report", "report.html", *TARGETS)
    assert out.returncode == 0, out.stderr[-4000:]
    html = (study / "report.html").read_text()
    assert '"Pipeline"' in html and f"results/plots/{WHERE}/pipeline_1f1b_m2.png" in html
    assert f"results/plots/{WHERE}/pipeline_methods_1f1b_m2.png" in html


def _jobs(out: str) -> dict[str, int]:
    """Rule -> job count from a dry run's job stats table."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", out, re.M)}


@pytest.mark.parametrize(("stages", "expected"), [([1], 0), ([2], 3)])
def test_a_study_runs_every_k2_plan_under_each_schedule_and_m(tmp_path, stages, expected):
    """k=1 plans are no pipelines; with m in [1, 2], GPipe runs both and 1F1B only m=2 (it needs m >= k)."""
    config = _config(tmp_path, stages=stages,
                     pipeline={**PIPELINE, "schedules": ["gpipe", "1f1b"], "micro_batches": [1, 2]})
    out = snakemake(tmp_path / "w", config, "--dry-run")
    assert out.returncode == 0, out.stderr[-4000:]
    jobs = _jobs(out.stdout + out.stderr)
    assert jobs.get("pipeline", 0) == jobs.get("plot_pipeline", 0) == jobs.get("pipeline_methods", 0) == expected
    assert jobs.get("pipeline_plan", 0) == jobs.get("plot_pipeline_methods", 0) == expected  # ours, the figure


def test_interleaved_1f1b_runs_where_two_stages_per_rank_fit(tmp_path):
    """Two stages per rank: k=4 runs on 2 ranks with m=2 and m=4; k=2 (one rank) and m=5 (not in whole rounds of
    2 ranks) are left out, and the start-up summary says so."""
    config = _config(tmp_path, stages=[2, 4],
                     pipeline={**PIPELINE, "schedules": ["interleaved1f1b"], "micro_batches": [2, 4, 5]})
    out = snakemake(tmp_path / "w", config, "--dry-run")
    assert out.returncode == 0, out.stderr[-4000:]
    jobs = _jobs(out.stdout + out.stderr)
    assert jobs.get("pipeline", 0) == jobs.get("pipeline_plan", 0) == 2
    assert "interleaved1f1b not run at k=2, m=2 (interleaved1f1b runs v >= 2 stages on each of k / v >= 2 ranks; " \
        "2 stage(s) per rank does not fit k=2)" in out.stderr
    assert "interleaved1f1b not run at k=4, m=5 (Interleaved1F1B runs m in rounds of 2 (the ranks): m=5" in out.stderr
