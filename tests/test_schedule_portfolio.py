"""The portfolio as data: explain lists every strategy in order with a reason, a solved schedule records the strategies
that ran, and the settings object is frozen and the one used."""

import dataclasses
import json

import pytest

from trainplan import cli
from trainplan.schedule import SolveOptions, replay, solve
from trainplan.schedule.baselines import no_recompute_events
from trainplan.schedule.chain import adjoint_chain
from trainplan.schedule.context import RunOptions
from trainplan.schedule.portfolio import BISECTION, FAST, PORTFOLIO, explain
from trainplan.schedule.problem import save_problem
from trainplan.schedule.settings import DEFAULTS, PortfolioSettings
from trainplan.schedule.synthetic import layered_graph, training_graph

NAMES = [s.name for s in PORTFOLIO]
PHASES = {"fast schedule", "bound", "improvement", "bisection"}


def training(fraction: float):
    p = training_graph(40, 7)
    peak = replay(p, no_recompute_events(p)).peak_bytes
    return p.with_budget(p.fixed_bytes + int((peak - p.fixed_bytes) * fraction))


def by_name(steps):
    return {s["name"]: s for s in steps}


def test_the_portfolio_runs_fast_schedules_first_and_the_bisection_last():
    assert len(set(NAMES)) == len(NAMES) and {s.phase for s in PORTFOLIO} == PHASES
    assert PORTFOLIO[0].phase == FAST and PORTFOLIO[-1].phase == BISECTION
    first_cpsat = next(i for i, s in enumerate(PORTFOLIO) if "CP-SAT" in s.name)
    assert all(s.phase in (FAST, BISECTION) for s in PORTFOLIO[:NAMES.index("program order of the first schedule")])
    assert first_cpsat > NAMES.index("live-interval relaxation (lower bound)")
    for s in PORTFOLIO:
        assert s.name and all(c.when for c in s.conditions)


@pytest.mark.parametrize("problem,skipped,runs", [
    (training(0.6), {"chain DP (revolve-style, adjoint chains)": "not an adjoint chain",
                     "recomputing from scratch": "an op cannot be recomputed",
                     "the bisection's schedule": "not a bisection's final run"},
     ["swap-only greedy runs (Belady, then least restore cost)",
      "DTR-style eviction plan, refined by ruin and recreate"]),
    (adjoint_chain(30, slots=5), {"swap-only greedy runs (Belady, then least restore cost)": "no op can be swapped",
                                   "DTR-style eviction plan, recompute only": "no op can be swapped"},
     ["chain DP (revolve-style, adjoint chains)"]),
])
def test_explain_lists_every_strategy_in_order_with_a_reason(problem, skipped, runs):
    lines = explain(problem, 10.0)
    assert [line.name for line in lines] == NAMES
    for line in lines:
        assert line.verdict == "runs" or line.verdict.startswith("runs if ") or line.verdict == "skipped"
        assert line.why or line.verdict != "skipped"  # a skipped strategy says why
    got = {line.name: line for line in lines}
    for name, why in skipped.items():
        assert got[name].verdict == "skipped" and got[name].why == why
    for name in runs:
        assert got[name].verdict == "runs"
    # conditions that depend on earlier results are named, not decided
    assert got["recomputing from scratch"].verdict in ("skipped", "runs if no fast schedule fits")
    assert got["keep time for the bisection"].verdict == "runs if no fast schedule fits"
    assert got[NAMES[-1]].verdict == "runs if no schedule met the requested budget"


def test_explain_below_the_floor_goes_straight_to_the_bisection_and_follows_the_options():
    p = layered_graph(60, 0)
    lines = explain(p.with_budget(p.floor_bytes - 1), 5.0)
    assert all(line.verdict == "skipped" and "memory floor" in line.why for line in lines[:-1])
    assert lines[-1].verdict.startswith("runs if")
    off = explain(p.with_budget(p.floor_bytes - 1), 5.0, RunOptions(bisect=False))
    assert off[-1].verdict == "skipped" and off[-1].why == "the bisection is off"
    assert off[NAMES.index("keep time for the bisection")].verdict == "skipped"


def test_the_schedule_records_the_strategies_that_ran():
    s = solve(training(0.6), time_limit_s=3, workers=2, seed=0, options=SolveOptions(bisect=False))
    steps = s.extra["strategies"]
    assert [step["name"] for step in steps] == NAMES
    assert all(step["why"] for step in steps) and all(step["phase"] in PHASES for step in steps)
    ran = {step["name"] for step in steps if step["ran"]}
    got = by_name(steps)
    # the schedule's origin ran; the strategies its flags exclude did not
    assert "DTR-style eviction plan, refined by ruin and recreate" in ran
    assert not got["chain DP (revolve-style, adjoint chains)"]["ran"]
    assert got["live-interval relaxation (lower bound)"]["ran"] and "relaxation" in s.extra
    assert got["staged bound (CP-SAT beside it with 2+ workers, deterministic)"]["ran"] == ("staged_bound" in s.extra)
    full = got["CP-SAT on the full model (hint, window LNS, grid growth)"]
    beside = "CP-SAT beside it" in (got["staged bound (CP-SAT beside it with 2+ workers, deterministic)"].get("result")
                                    or "")
    assert full["ran"] == (s.extra["mip"]["status"] != "SKIPPED" and not beside)
    assert not got[NAMES[-1]]["ran"] and got[NAMES[-1]]["why"] == "the bisection is off"
    # what explain decided before solving holds: every strategy it skipped was skipped, every one it ran ran
    for line in explain(training(0.6), 3, RunOptions(bisect=False)):
        if line.verdict == "skipped":
            assert not got[line.name]["ran"], line.name
        elif line.verdict == "runs":
            assert got[line.name]["ran"], line.name


def test_a_bisection_records_its_final_run():
    p = layered_graph(100, 0)
    s = solve(p.with_budget(p.floor_bytes - 1), time_limit_s=3, workers=1, seed=0)
    assert s.extra["budget_status"] == "proven_infeasible" and s.ok
    steps = s.extra["strategies"]
    assert not any(step["ran"] for step in steps[:-1])
    bisection = steps[-1]
    assert bisection["ran"] and f"raised to {s.budget_bytes} B" in bisection["result"]
    final = by_name(bisection["final_run"])
    assert list(final) == NAMES[:-1]
    assert final["the bisection's schedule"]["ran"]  # the final run starts from the bisection's schedule
    assert not final["keep time for the bisection"]["ran"]


def test_the_settings_are_frozen_and_checked():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULTS.heuristic_share = 0.5  # type: ignore[misc]
    with pytest.raises(ValueError, match="probe_share"):
        PortfolioSettings(probe_share=-1.0)
    doc = PortfolioSettings.__doc__
    for f in dataclasses.fields(PortfolioSettings):
        assert f"``{f.name}``" in doc, f.name  # every setting says what it trades off


def test_a_changed_setting_changes_what_runs():
    """The settings handed to solve are the ones used: with no variables allowed per second the staged bound is
    skipped (the explanation says so before solving), and the schedule is found without it."""
    p = training(0.6)
    no_staged = dataclasses.replace(DEFAULTS, staged_variables_per_second=0)
    name = "staged bound (CP-SAT beside it with 2+ workers, deterministic)"
    line = next(line for line in explain(p, 3, RunOptions(settings=no_staged)) if line.name == name)
    assert line.verdict == "skipped" and "variables" in line.why
    assert next(line for line in explain(p, 3) if line.name == name).verdict.startswith("runs if")
    s = solve(p, time_limit_s=3, workers=2, seed=0, options=SolveOptions(bisect=False, settings=no_staged))
    assert not by_name(s.extra["strategies"])[name]["ran"] and "staged_bound" not in s.extra
    default = solve(p, time_limit_s=3, workers=2, seed=0, options=SolveOptions(bisect=False))
    assert by_name(default.extra["strategies"])[name]["ran"] and "staged_bound" in default.extra


def test_a_changed_setting_changes_the_time_kept_for_the_bisection():
    """No fast schedule meets 1.1x the floor of the 300-op layered DAG (recompute only): the attempt keeps
    no_heuristic_share of the limit, the rest goes to the bisection."""
    p = layered_graph(300, 0)
    p = p.with_budget(int(1.1 * p.floor_bytes))
    quarter = dataclasses.replace(DEFAULTS, no_heuristic_share=0.25)
    s = solve(p, time_limit_s=2.0, workers=1, seed=0, options=SolveOptions(settings=quarter))
    keep = by_name(s.extra["strategies"])["keep time for the bisection"]
    assert keep["ran"] and "now 0.5 s" in keep["result"]


def test_the_cli_explains_without_solving(tmp_path, capsys):
    src = tmp_path / "p.json"
    save_problem(src, training(0.6))
    assert cli.main(["schedule", str(src), "--explain", "--time-limit", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "time limit 5 s" in out[0] and len(out) == 1 + len(NAMES)
    for i, (line, name) in enumerate(zip(out[1:], NAMES), 1):
        assert line.startswith(f"{i:2d}. [") and name in line
    assert not list(tmp_path.glob("*.json"))[1:]  # nothing written
    with pytest.raises(SystemExit):
        cli.main(["schedule", str(src), "--explain", "-o", str(tmp_path / "s.json")])
    assert json.loads(src.read_text())["budget_bytes"] == training(0.6).budget_bytes
