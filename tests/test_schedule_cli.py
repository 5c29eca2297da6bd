"""CLI round trip via subprocess, and one-line errors with exit status 2."""

import json
import subprocess
import sys

import pytest

from trainplan.io import read_json
from trainplan.schedule import problem_from_dict, replay
from trainplan.schedule.baselines import no_recompute_events

PROBLEM = {
    "ops": [{"id": "x", "time": 0.001, "bytes": 100, "inputs": [], "name": "input"},
            {"id": "a", "time": 0.002, "bytes": 300, "inputs": ["x"]},
            {"id": "b", "time": 0.002, "bytes": 300, "inputs": ["a"]},
            {"id": "g", "time": 0.004, "bytes": 100, "inputs": ["b", "x"]}],
    "fixed_bytes": 0, "budget_bytes": 650, "bandwidth": 1e6, "keep": ["g"], "nodes": 4,
}


def run(*args):
    return subprocess.run([sys.executable, "-m", "trainplan.cli", *args], capture_output=True, text=True)


def schedule_problem(tmp_path, *options):
    """``trainplan schedule`` on PROBLEM written to tmp_path: the process and the output path."""
    src, out = tmp_path / "p.json", tmp_path / "s.json"
    src.write_text(json.dumps(PROBLEM))
    return run("schedule", str(src), "-o", str(out), *options), out


def test_round_trip_all_methods(tmp_path):
    res, out = schedule_problem(tmp_path, "--time-limit", "2", "--workers", "1", "--method", "all")
    assert res.returncode == 0, res.stderr
    data = read_json(out)
    p = problem_from_dict(PROBLEM)
    for s in [data, *data["baselines"].values()]:
        if s["events"]:
            rep = replay(p, s["events"])
            assert (rep.time, rep.peak_bytes) == (s["time"], s["peak_bytes"])
    assert data["method"] == "ours" and data["status"] == "optimal" and data["peak_bytes"] <= 650
    assert set(data["baselines"]) == {"no_recompute", "sqrt_checkpoint", "checkmate", "swap_only"}


def test_bad_file_one_line_error(tmp_path):
    bad = dict(PROBLEM, ops=[*PROBLEM["ops"][:3], {"id": "g", "time": 1, "bytes": 1, "inputs": ["zz"]}])
    src = tmp_path / "bad.json"
    src.write_text(json.dumps(bad))
    res = run("schedule", str(src), "-o", str(tmp_path / "s.json"))
    assert res.returncode == 2
    assert res.stderr.strip() == f"trainplan schedule: error: {src}: op 'g' input 'zz' is unknown"
    assert not (tmp_path / "s.json").exists()
    missing = run("schedule", str(tmp_path / "none.json"), "-o", str(tmp_path / "s.json"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr and "none.json" in missing.stderr


def test_a_stage_of_a_schedules_file(tmp_path):
    """``--stage N`` solves stage N's problem of the schedule rule's schedules.json; a missing stage is named."""
    src, out = tmp_path / "schedules.json", tmp_path / "s.json"
    src.write_text(json.dumps({"stages": [{"index": 0, "problem": PROBLEM}]}))
    res = run("schedule", str(src), "--stage", "0", "-o", str(out), "--time-limit", "2", "--workers", "1")
    assert res.returncode == 0, res.stderr
    data = read_json(out)
    assert replay(problem_from_dict(PROBLEM), data["events"], 650).time == data["time"]
    res = run("schedule", str(src), "--stage", "1", "-o", str(tmp_path / "t.json"))
    assert res.returncode == 2 and res.stderr.strip() == f"trainplan schedule: error: {src}: no stage 1 (a schedules.json has a 'stages' list)"
    assert not (tmp_path / "t.json").exists()


def test_the_schedule_command_does_not_import_torch(tmp_path):
    """Start-up is part of the time limit's promise: the schedule path loads no torch (docs/schedule.md)."""
    src, out = tmp_path / "p.json", tmp_path / "s.json"
    src.write_text(json.dumps(PROBLEM))
    code = ("import sys; from trainplan import cli; "
            f"rc = cli.main(['schedule', {str(src)!r}, '-o', {str(out)!r}, '--time-limit', '1']); "
            "print(rc, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split()[-2:] == ["0", "False"], done.stderr[-2000:]
    assert read_json(out)["status"] in ("optimal", "feasible")


@pytest.mark.parametrize("option, value, message", [
    ("--time-limit", "0", "must be a finite number > 0"),
    ("--time-limit", "nan", "must be a finite number > 0"),
    ("--workers", "0", "must be an integer >= 1"),
    ("--budget", "-5", "budget '-5': a byte count must be >= 0"),
    ("--seed", "x", "expected an integer"),
])
def test_a_bad_option_is_named_and_nothing_is_written(tmp_path, option, value, message):
    res, out = schedule_problem(tmp_path, option, value)
    assert res.returncode == 2 and f"argument {option}: {message}" in res.stderr and not out.exists()
    lay = tmp_path / "l.json"
    lay.write_text(json.dumps({"layouts": ["a", "b"], "nodes": [{"id": "n", "cost": {"a": 1, "b": 2}}], "edges": []}))
    if option in ("--time-limit", "--workers"):
        res = run("layout", str(lay), "-o", str(out), option, value)
        assert res.returncode == 2 and f"argument {option}: {message}" in res.stderr and not out.exists()


def test_a_raised_budget_says_what_is_known_about_the_requested_one(tmp_path):
    res, out = schedule_problem(tmp_path, "--budget", "100", "--time-limit", "2", "--workers", "1")
    assert res.returncode == 0, res.stderr
    data = read_json(out)
    assert data["requested_budget_bytes"] == 100 and data["budget_status"] == "proven_infeasible"
    assert data["status"] == "raised" and " ours raised " in res.stdout
    assert f"budget={data['budget_bytes']} (raised from 100: proven_infeasible)" in res.stdout


@pytest.mark.parametrize(("given", "expected"), [("650", 650), ("0.65KB", 650), ("1.0", "peak")])
def test_the_budget_option_takes_bytes_with_a_unit_or_a_fraction(tmp_path, given, expected):
    """``--budget`` reads trainplan.budget's forms: plain bytes (as before), bytes with a unit, or a fraction of
    the problem's no-recompute peak above its fixed bytes (1.0: that peak)."""
    res, out = schedule_problem(tmp_path, "--budget", given, "--time-limit", "1", "--workers", "1")
    assert res.returncode == 0, res.stderr
    peak = replay(problem_from_dict(PROBLEM), no_recompute_events(problem_from_dict(PROBLEM))).peak_bytes
    assert read_json(out)["budget_bytes"] == (peak if expected == "peak" else expected)


def test_a_bad_budget_is_one_line_naming_it(tmp_path):
    res, out = schedule_problem(tmp_path, "--budget", "2 gigs")
    assert res.returncode == 2 and not out.exists()
    assert res.stderr.strip().splitlines()[-1] == (
        "trainplan schedule: error: argument --budget: budget '2 gigs': unknown unit 'gigs'; use one of B, KB, MB, "
        "GB, TB, KiB, MiB, GiB, TiB")
