"""The workflow end to end on a tiny study: artifacts, caching, and clear config errors (Snakemake subprocess)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import update_config, validate
from workflow_run import REPO, TINY, copy_of_study, snakemake

from trainplan.config_checks import ConfigError, budget_wildcards, check_config
from trainplan.schedule.budgeted_stages import read_stage_schedules
from trainplan.start_checks import CheckRecord

pytestmark = pytest.mark.workflow
DEFAULT_CONFIG = REPO / "config" / "config.yaml"
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


def planned_jobs(workdir: Path, config: Path) -> dict[str, int]:
    """Rule -> job count of a dry run."""
    out = snakemake(workdir, config, "--dry-run", "--quiet", "rules")
    assert out.returncode == 0, out.stderr
    jobs = {}
    for line in (out.stdout + out.stderr).splitlines():
        m = re.fullmatch(r"(\w+)\s+(\d+)", line.strip())
        if m and m.group(1) != "total":
            jobs[m.group(1)] = int(m.group(2))
    return jobs


def edited(tmp: Path, name: str, edit) -> Path:
    cfg = yaml.safe_load(TINY.read_text())
    edit(cfg)
    path = tmp / name
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def study(tiny_study) -> Path:
    return tiny_study


def test_artifacts_parse(study):
    for model in ("tiny_gpt2", "small_cnn"):
        nodes = pd.read_parquet(study / f"results/export/{model}/cpu/nodes.parquet")
        tensors = pd.read_parquet(study / f"results/export/{model}/cpu/tensors.parquet")
        graph = json.loads((study / f"results/export/{model}/cpu/graph.json").read_text())
        assert graph["n_ops"] == len(nodes) > 20
        assert set(tensors.kind) >= {"parameter", "activation", "gradient", "input"}
        ops = pd.read_parquet(study / f"results/profile/{model}/cpu/ops.parquet")
        assert ops.name.tolist() == nodes.name.tolist()
        summary = json.loads((study / f"results/profile/{model}/cpu/summary.json").read_text())
        assert summary["op_sum_over_step"] == pytest.approx(summary["op_sum_s"] / summary["step_time_s"])
        link = summary["host_link"]  # measured (the tiny config says so) and used by every stage problem
        assert link["source"] == "measured" and link["tensors"] > 0
        assert summary["host_link_bytes_per_s"] == pytest.approx(2 * link["bytes_per_direction"] / (link["swap_out_s"] + link["swap_in_s"]))
        files = list((study / f"results/schedule/{model}/cpu").glob("k*/b*/schedules.json"))
        assert files
        for path in files:
            for stage in read_stage_schedules(path):  # problems valid, every schedule replays to its numbers
                assert stage.problem["bandwidth"] == summary["host_link_bytes_per_s"]
                assert set(stage.methods) == {"ours", "no_recompute", "sqrt_checkpoint", "checkmate", "swap_only"}
        assert (study / f"logs/export/{model}/cpu.log").read_text()
        assert len(link["sizes"]) == link["tensors"] and sum(link["sizes"]) == link["bytes_per_direction"]
        # the CPU's host memory is shared: its plans are recompute-only, so the validation has no swap to time
        # (tests/test_validate_workflow.py validates swap plans on a device declared host_memory: separate)
        docs = [json.loads(p.read_text()) for p in (study / f"results/validate/{model}/cpu").glob("k*/b*/validation.json")]
        assert docs and all(d["memory_model"]["host_memory"] == "shared" and d["timing"]["host_link_now"] is None
                            for d in docs)
        # the profile and the validation's timing run in the same host-memory regime (docs/artifacts.md,
        # `host_allocator`); the validation meters peaks with freed memory returned
        assert {d["settings"]["host_allocator"]["timing"] for d in docs} == {summary["host_allocator"]}
        assert summary["host_allocator"].startswith("glibc malloc keeps freed memory")


def test_rerun_is_a_noop(study):
    assert planned_jobs(study, TINY) == {}


def test_new_budget_reruns_no_export_or_profile(study, tmp_path):
    cfg = edited(tmp_path, "budget.yaml", lambda c: c.update(budgets=[0.6, 0.4]))
    jobs = planned_jobs(study, cfg)
    assert "export" not in jobs and "profile" not in jobs


def test_changed_model_reruns_only_that_model(study, tmp_path):
    cfg = edited(tmp_path, "model.yaml", lambda c: c["models"]["tiny_gpt2"]["inputs"].update(seq_len=8))
    out = snakemake(study, cfg, "--dry-run")
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    assert "model=tiny_gpt2" in text and "model=small_cnn" not in text


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda c: c.update(modles=c.pop("models")), "modles"),
        (lambda c: c["models"]["tiny_gpt2"].update(architecture="GPT9LMHeadModel"), "GPT9LMHeadModel"),
        (lambda c: c["study"].update(plan=["tiny_gpt2", "nosuchmodel"]), "nosuchmodel"),
        (lambda c: c.update(device="tpu"), "config key 'device': 'tpu' is not one of devices"),
        (lambda c: c.update(budgets=[1.5]), "budgets"),
        # a budget is a fraction (a number) or bytes with a unit: refused by the schema, or at start by the parser
        (lambda c: c.update(budgets=[0.6, "0.5"]), "On instance['budgets'][1]"),
        (lambda c: c.update(budgets=[0.6, "2GX"]), "config key 'budgets[1]': budget '2GX': unknown unit 'GX'"),
        (lambda c: c.update(budgets=["2GiB", "2048 MiB"]), "config key 'budgets[1]': budget '2048 MiB' repeats b2GiB"),
        (lambda c: c["devices"]["cpu"].update(host_link_gbytes_per_s="fast"), "host_link_gbytes_per_s"),
        # a model config's typo would silently plan the reference size (GPT-2's 12 layers): refused, named
        (lambda c: c["models"]["tiny_gpt2"]["config"].update(n_layr=c["models"]["tiny_gpt2"]["config"].pop("n_layer")),
         "model 'tiny_gpt2': config key 'n_layr' is not an option of GPT2Config (did you mean 'n_layer'?)"),
        (lambda c: c["models"]["small_cnn"].update(kwargs={"chanels": 4}),
         "model 'small_cnn': kwargs key 'chanels' is not an option of trainplan.zoo:small_cnn (did you mean 'channels'?)"),
        # YAML's .nan and .inf are numbers to JSON Schema's bounds: refused by the schema's finite number
        (lambda c: c.update(budgets=[float("nan")]), "On instance['budgets'][0]"),
        (lambda c: c["solver"].update(time_limit_s=float("inf")), "On instance['solver']['time_limit_s']"),
    ],
)
def test_bad_config_is_refused_at_start_naming_the_key(tmp_path, edit, named):
    """The start-up checks of workflow/rules/common.smk, run in this process on the tiny config layered over the
    default as Snakemake layers it: the schema, then trainplan.config_checks."""
    cfg = yaml.safe_load(TINY.read_text())
    edit(cfg)
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    update_config(config, cfg)
    with pytest.raises((WorkflowError, ConfigError)) as caught:
        validate(config, schema=str(SCHEMA))
        check_config(config, CheckRecord(tmp_path / "checks"))
        budget_wildcards(config["budgets"])
    assert named in str(caught.value)


@pytest.mark.parametrize(("edit", "named"), [
    (lambda c: c.update(budgets=[1.5]), "budgets"),  # the schema
    (lambda c: c["study"].update(plan=["tiny_gpt2", "nosuchmodel"]), "nosuchmodel"),  # trainplan.config_checks
])
def test_bad_config_fails_fast_naming_the_key(tmp_path, edit, named):
    """Snakemake itself stops at start with the message, and writes nothing."""
    cfg = edited(tmp_path, "bad.yaml", edit)
    out = snakemake(tmp_path / "w", cfg, "--dry-run")
    assert out.returncode != 0
    assert named in out.stderr + out.stdout
    assert not (tmp_path / "w" / "results").exists()


def test_yaml_syntax_errors_name_the_file(tmp_path):
    """A file the config names fails at start with the key, the file and the line; a --configfile is parsed by
    Snakemake before the workflow runs: its message names no file, `--verbose` shows the file and line."""
    table = tmp_path / "table.yaml"
    table.write_text("name: t\nops: [aten.mm.default\n")
    cfg = edited(tmp_path, "table_cfg.yaml", lambda c: c["fuse"].update(targets={"acclib": {"table": str(table)}}))
    out = snakemake(tmp_path / "w", cfg, "--dry-run")
    assert out.returncode != 0 and not (tmp_path / "w" / "results").exists()
    assert f"config key 'fuse.targets.acclib.table': support table {table}: invalid YAML at line 3" in out.stdout + out.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text(TINY.read_text().replace("budgets: [0.6]", "budgets: [0.6"))
    out = snakemake(tmp_path / "w", broken, "--dry-run", "--verbose")
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Config file is not valid JSON or YAML" in text
    assert re.search(rf'in "{re.escape(str(broken))}", line \d+, column \d+', text), text[-2000:]


def test_dry_run_names_each_stages_models_and_the_tiny_study_stays_tiny(tmp_path):
    out = snakemake(tmp_path / "w", TINY, "--dry-run")
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    assert text.count("trainplan study on cpu") == 1
    assert "study.plan (export, profile, partition, schedule, balance, validate): tiny_gpt2, small_cnn\n" in text
    assert "study.overflow (fp16 overflow loop): tiny_gpt2\n" in text
    # the default config's full-size models are defined (inherited) but no job runs them
    assert not re.search(r"model=(gpt2|resnet50|t5_ff)\b", text)


def test_a_deleted_or_damaged_schedules_file_is_noticed(study, tmp_path):
    """Every stage's schedules live in one declared file, a target of the study: deleting it reruns the
    schedule rule, and a damaged one stops the balance rule with an error naming the file and the stage.
    (In a copy of the study: it alters it.)"""
    study = copy_of_study(study, tmp_path / "w")
    path = study / "results/schedule/small_cnn/cpu/k1/b0.6/schedules.json"
    original = path.read_text()
    path.unlink()
    assert planned_jobs(study, TINY).get("schedule") == 1
    data = json.loads(original)
    events = data["stages"][0]["schedule"]["events"]
    events.insert(0, ["free", events[0][1]])  # frees a tensor before anything computed it
    path.write_text(json.dumps(data))
    out = snakemake(study, TINY, "results/balance/small_cnn/cpu/k1/b0.6/plan.json")
    log = (study / "logs/balance/small_cnn/cpu/k1/b0.6.log").read_text()
    assert out.returncode != 0
    assert f"{path.relative_to(study)}: stage 0: event 0 free '{events[1][1]}': op is not resident" in log
