"""A finished tiny study: its provenance, `trainplan publish` rebuilding the report from the unpacked archive,
and its artifacts damaged one by one, each named in the error of the rule (or reader) that reads it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
import yaml
from workflow_run import copy_of_study

from trainplan.cli import main as trainplan
from trainplan.errors import ArtifactError
from trainplan.execute import PlanError, load_plan
from trainplan.io import read_json
from trainplan.schedule.budgeted_stages import read_stage_schedules

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "config" / "config.yaml"

pytestmark = pytest.mark.workflow


def snakemake(workdir: Path, *args: str, config: str | Path = TINY,
              snakefile: Path = REPO / "Snakefile") -> subprocess.CompletedProcess[str]:
    """The workflow of ``snakefile`` with the trainplan of its own checkout (an unpacked archive's: what
    ``pip install -e .`` there gives; the workflow refuses another checkout's package)."""
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(snakefile), "--directory", str(workdir),
           "--configfile", str(workdir / config), "--cores", "2", *args]
    env = {**os.environ, "PYTHONPATH": str(snakefile.parent / "src")}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, check=False, env=env)


@pytest.fixture(scope="module")
def study(tiny_study, tmp_path_factory) -> Path:
    """A copy of the tiny study (its overflow loop has two roots on tiny_gpt2: three passes), report built."""
    workdir = copy_of_study(tiny_study, tmp_path_factory.mktemp("provenance") / "study")  # nothing reruns
    out = snakemake(workdir, "--report", "report.html")
    assert out.returncode == 0, out.stderr[-4000:]
    return workdir


def report_files(html: Path) -> set[str]:
    """Result files a Snakemake report lists."""
    return set(re.findall(r"results/[\w./-]+?\.(?:png|csv|json)", html.read_text()))


def test_provenance_records_code_software_machine_config(study):
    prov = read_json(study / "results/provenance.json", schema="provenance")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert prov["git"]["commit"] == head and isinstance(prov["git"]["dirty"], bool)
    assert prov["versions"]["torch"] == torch.__version__ and prov["versions"]["python"] == sys.version.split()[0]
    assert prov["machine"]["cpu_cores"] == os.cpu_count()
    assert prov["config"]["study"]["plan"] == ["tiny_gpt2", "small_cnn"] and prov["seeds"]["seed"] == prov["config"]["seed"]
    assert prov["config"]["profile"]["repeats"] == 2  # resolved: schema defaults and the study's values
    files = sorted(p.relative_to(study).as_posix() for p in (study / "results").rglob("*")
                   if p.is_file() and p.name != "provenance.json" and not p.name.startswith("."))
    assert sorted(prov["results"]) == files
    for name in files[:5]:
        assert prov["results"][name] == hashlib.sha256((study / name).read_bytes()).hexdigest()


def test_published_archive_rebuilds_the_report(study, tmp_path, capsys):
    archive = tmp_path / "tiny-study.tar.gz"
    assert trainplan(["publish", "-d", str(study), "--repo", str(REPO), "-o", str(archive)]) == 0
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "unpacked", filter="tar")
    root = tmp_path / "unpacked" / "tiny-study"
    assert (root / "Snakefile").is_file() and (root / "src/trainplan/provenance/archive.py").is_file()
    args = ("--replace-workflow-config",)
    dry = snakemake(root, "--dry-run", *args, config="config/published.yaml", snakefile=root / "Snakefile")
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:] + dry.stderr[-3000:]
    out = snakemake(root, "--report", "report.html", *args, config="config/published.yaml", snakefile=root / "Snakefile")
    assert out.returncode == 0, out.stderr[-3000:]
    rebuilt, original = report_files(root / "report.html"), report_files(study / "report.html")
    assert rebuilt == original and "results/provenance.json" in rebuilt and len(rebuilt) > 10
    # A result changed after the provenance was written: publishing refuses, naming it (exit 2, no archive).
    damaged = tmp_path / "damaged"
    copy_of_study(study, damaged)
    (damaged / "results/validate/summary.csv").write_text("model\n")
    capsys.readouterr()
    assert trainplan(["publish", "-d", str(damaged), "--repo", str(REPO), "-o", str(tmp_path / "x.tar.gz")]) == 2
    assert "results/validate/summary.csv: changed since" in capsys.readouterr().err
    assert not (tmp_path / "x.tar.gz").exists()


def test_verify_names_a_file_damaged_in_place_and_its_command_regenerates_it(study, tmp_path, capsys):
    """One byte flipped with the file's time kept: Snakemake sees nothing, verify names the file, and the command
    it prints reruns that file's job and the provenance alone (the recorded config reproduces every param)."""
    work = copy_of_study(study, tmp_path / "study")
    target = work / "results/plots/tiny_gpt2/cpu/op_time.png"
    data, stat = bytearray(target.read_bytes()), target.stat()
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    capsys.readouterr()
    assert trainplan(["verify", "-d", str(work)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{target}: changed since results/provenance.json was written" and len(lines) == 3
    command = shlex.split(lines[-1])
    assert command[0] == "snakemake" and command[-2:] == ["--forcerun", "results/plots/tiny_gpt2/cpu/op_time.png"]
    out = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    stats = (out.stdout + out.stderr).split("Job stats:")[1].split("total")[0]
    assert dict(re.findall(r"^(\w+)\s+(\d+)$", stats, re.M)) == {"all": "1", "plot_profile": "1", "provenance": "1"}
    assert trainplan(["verify", "-d", str(work)]) == 0
    assert capsys.readouterr().out.startswith(f"{work}: OK, all ")


def damage(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_damaged_artifacts_are_named(study, tmp_path):
    work = tmp_path / "study"
    copy_of_study(study, work)
    base = work / "results"
    def reader(schema):
        return lambda path: read_json(path, schema=schema)

    cases = {
        "partition/tiny_gpt2/cpu/k1/partition.json": (reader("partition"), lambda d: d["stages"][0]["nodes"].pop(), "n_nodes"),
        "schedule/small_cnn/cpu/k1/b0.6/schedules.json": (
            read_stage_schedules, lambda d: d["stages"][0]["problem"]["ops"][0].pop("time"), "stage 0: .*'time'"),
        "overflow/tiny_gpt2/iter1/findings.json": (reader("findings"), lambda d: d["findings"].pop(), "'n_recorded' says"),
        "balance/tiny_gpt2/cpu/k1/b0.6/iterations.json": (
            reader("iterations"), lambda d: d.update(chosen_iteration=7), "chosen_iteration"),
        "validate/small_cnn/cpu/k1/b0.6/validation.json": (
            reader("validation"), lambda d: d["stages"][0].update(index=3), r"stages\[0\]\.index is 3"),
    }
    for rel, (read, edit, message) in cases.items():
        damage(base / rel, edit)
        with pytest.raises(ArtifactError, match=rf"{re.escape(str(base / rel))}: .*{message}"):
            read(base / rel)
    plan = base / "balance/small_cnn/cpu/k1/b0.6/plan.json"
    damage(plan, lambda d: d.update(k=3))
    with pytest.raises(PlanError, match=rf"{re.escape(str(plan))}: inconsistent plan artifact .*'k' is 3"):
        load_plan(plan)
    # The issue's case through the workflow: iter0's policy cut mid-list (still valid YAML); the rerun of
    # the pass that reads it stops, naming the file, instead of running with the deny list gone.
    policy = base / "overflow/tiny_gpt2/iter0/policy_next.yaml"
    lines = policy.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if line.startswith("deny:")) + 3
    policy.write_text("".join(lines[:cut]))
    assert yaml.safe_load(policy.read_text())["deny"]
    out = snakemake(work, "results/overflow/study.csv")
    log = (work / "logs/overflow/tiny_gpt2/iter1.log").read_text()
    assert out.returncode != 0 and "policy_next.yaml" in out.stderr
    assert f"{policy.relative_to(work)}: inconsistent policy artifact" in log and "'counts.deny' says" in log
