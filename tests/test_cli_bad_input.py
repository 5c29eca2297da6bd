"""Binary or damaged input to every ``trainplan`` subcommand: one line naming the file, exit 2, nothing written;
``trainplan verify`` on a small finished study: intact (exit 0), damaged or missing files named (exit 1)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest
import yaml

from trainplan.cli import main as trainplan
from trainplan.io import write_json
from trainplan.provenance import git_state, provenance
from trainplan.provenance.verify import PROVENANCE, RECORDED_CONFIG

CONFIG = {"seed": 3, "models": {}, "study": {"plan": []}, "budgets": [0.5]}  # what a provenance needs
GRAPH = {"nodes": [{"id": "a", "op": "aten.relu.default", "supported": True}], "edges": []}


@pytest.fixture()
def noise(tmp_path):
    """4 KiB of random bytes (not UTF-8) in a file."""
    path = tmp_path / "noise.bin"
    path.write_bytes(b"\xff\xfe" + os.urandom(4094))
    return path


def finished_study(root):
    """A git work tree holding two result files and the provenance recorded over them."""
    (root / "results/a").mkdir(parents=True)
    (root / "results/a/x.json").write_text('{"x": 1}\n')
    (root / "results/b.csv").write_text("b\n1\n")
    (root / "Snakefile").write_text("# the workflow\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "Snakefile"], check=True)
    record = provenance(CONFIG, git_state(root), root / "results", root / PROVENANCE)
    write_json(root / PROVENANCE, record)
    return root


def one_line_error(capsys, command: str, path) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"trainplan {command}: error: ") and str(path) in err, err
    return err


@pytest.mark.parametrize("args", [
    ["schedule", "{noise}"], ["schedule", "{noise}", "--stage", "0"], ["layout", "{noise}"], ["align", "{noise}"],
    ["fuse", "{noise}"], ["fuse", "{graph}", "--support", "{noise}"], ["pipeline-run", "{noise}", "--config", "{noise}"],
])
def test_random_bytes_to_a_subcommand_name_the_file(tmp_path, capsys, noise, args):
    (tmp_path / "g.json").write_text(json.dumps(GRAPH))
    argv = [a.format(noise=noise, graph=tmp_path / "g.json") for a in args] + ["-o", str(tmp_path / "out.json")]
    assert trainplan(argv) == 2
    assert "not UTF-8 text" in one_line_error(capsys, args[0], noise)
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("command, doc, named", [
    ("schedule", {"ops": [{"id": "a", "time": float("nan"), "bytes": 1}], "budget_bytes": 1, "bandwidth": 1.0},
     "op 'a' key 'time'"),
    ("schedule", {"ops": [{"id": "a", "time": 1.0, "bytes": 1}], "budget_bytes": 1, "bandwidth": float("inf")},
     "'bandwidth'"),
    ("layout", {"layouts": ["nchw"], "nodes": [{"id": "c", "cost": {"nchw": float("inf")}}], "edges": []},
     "node 'c' cost 'nchw'"),
    ("fuse", {"nodes": [{"id": "a", "op": "x", "supported": True,
                         "inputs": [{"shape": [float("nan")], "dtype": "float32"}]}], "edges": []}, "node 'a'"),
])
def test_nan_and_infinity_in_a_users_file_are_refused(tmp_path, capsys, command, doc, named):
    """Python's json reads NaN and Infinity: every number a subcommand takes from a user's file must be finite."""
    path = tmp_path / "in.json"
    path.write_text(json.dumps(doc))
    assert trainplan([command, str(path), "-o", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err, err
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("command", ["publish", "verify"])
def test_a_binary_provenance_document_is_named(tmp_path, capsys, command):
    study = finished_study(tmp_path / "study")
    (study / PROVENANCE).write_bytes(os.urandom(64) + b"\xff")
    argv = [command, "-d", str(study)] + (["-o", str(tmp_path / "s.tar.gz")] if command == "publish" else [])
    assert trainplan(argv) == 2
    one_line_error(capsys, command, study / PROVENANCE)


def test_publish_names_a_damaged_metadata_file(tmp_path, capsys):
    study = finished_study(tmp_path / "study")
    record = study / ".snakemake/metadata/cmVzdWx0cy9iLmNzdg=="
    record.parent.mkdir(parents=True)
    record.write_bytes(b"\x80" + os.urandom(32))
    assert trainplan(["publish", "-d", str(study), "-o", str(tmp_path / "s.tar.gz")]) == 2
    one_line_error(capsys, "publish", record)
    assert not (tmp_path / "s.tar.gz").exists()


def test_yaml_syntax_errors_give_file_line_and_column(tmp_path, capsys):
    (tmp_path / "g.json").write_text(json.dumps(GRAPH))
    table = tmp_path / "t.yaml"
    table.write_text("name: toy\nops: [aten.relu.default\nrules: []\n")
    assert trainplan(["fuse", str(tmp_path / "g.json"), "--support", str(table), "-o", str(tmp_path / "o.json")]) == 2
    assert f"support table {table}: invalid YAML at line 3, column 6: expected ',' or ']'" in one_line_error(
        capsys, "fuse", table)


def test_verify_an_intact_study(tmp_path, capsys):
    study = finished_study(tmp_path / "study")
    assert trainplan(["verify", "-d", str(study)]) == 0
    assert capsys.readouterr().out == f"{study}: OK, all 2 result files match {PROVENANCE}\n"
    assert not (study / RECORDED_CONFIG).exists()


def test_verify_names_damaged_and_missing_files_and_the_command(tmp_path, capsys):
    study = finished_study(tmp_path / "study")
    damaged, gone = study / "results/a/x.json", study / "results/b.csv"
    stat = damaged.stat()
    damaged.write_text('{"x": 2}\n')  # same size, and the time kept: only the sha256 tells
    os.utime(damaged, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    gone.unlink()
    assert trainplan(["verify", "-d", str(study)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [f"{damaged}: changed since {PROVENANCE} was written",
                         f"{gone}: missing since {PROVENANCE} was written",
                         f"{study}: 2 of 2 result files damaged or missing; to regenerate them (and what depends on "
                         "them), run from the workflow's directory:"]
    config = study.resolve() / RECORDED_CONFIG
    assert shlex.split(lines[3]) == ["snakemake", "--directory", str(study.resolve()), "--configfile", str(config),
                                     "--replace-workflow-config", "--cores", "all",
                                     "--forcerun", "results/a/x.json", "results/b.csv"]
    assert yaml.safe_load(config.read_text()) == CONFIG  # the config the provenance recorded
