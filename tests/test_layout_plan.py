"""Layout planner: exact methods against an independent exhaustive search and a test-local chain DP, via the CLI."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys

import pytest

from trainplan.cli import main


def _random_file(rng: random.Random, n: int, layouts: list[str], chain: bool) -> dict:
    """A problem file written here, independently of trainplan's generator."""
    nodes = []
    for i in range(n):
        node = {"id": f"v{i}", "cost": {lay: rng.uniform(0.1, 2.0) for lay in layouts}}
        if rng.random() < 0.1:
            node["fixed"] = rng.choice(layouts)
        nodes.append(node)
    pairs = [(i - 1, i) for i in range(1, n)]
    if not chain:
        pairs += [(j, i) for i in range(2, n) for j in range(i - 1) if rng.random() < 0.25]
    edges = [{"src": f"v{j}", "dst": f"v{i}",
              "transform": {f"{a}->{b}": rng.uniform(0.0, 1.5) for a in layouts for b in layouts if a != b}}
             for j, i in pairs]
    return {"layouts": layouts, "nodes": nodes, "edges": edges}


def _time(data: dict, assign: dict[str, str]) -> float:
    cost = {nd["id"]: nd for nd in data["nodes"]}
    total = sum(cost[n]["cost"][lay] for n, lay in assign.items())
    for e in data["edges"]:
        a, b = assign[e["src"]], assign[e["dst"]]
        total += 0.0 if a == b else e["transform"][f"{a}->{b}"]
    return total


def _choices(data: dict) -> list[list[str]]:
    return [[nd["fixed"]] if "fixed" in nd else list(nd["cost"]) for nd in data["nodes"]]


def _exhaustive(data: dict) -> float:
    ids = [nd["id"] for nd in data["nodes"]]
    return min(_time(data, dict(zip(ids, combo))) for combo in itertools.product(*_choices(data)))


def _chain_dp(data: dict) -> float:
    ids = [nd["id"] for nd in data["nodes"]]
    nodes = {nd["id"]: nd for nd in data["nodes"]}
    trans = {(e["src"], e["dst"]): e["transform"] for e in data["edges"]}
    choices = dict(zip(ids, _choices(data)))
    best = {a: nodes[ids[0]]["cost"][a] for a in choices[ids[0]]}
    for p, n in zip(ids, ids[1:]):
        best = {b: nodes[n]["cost"][b] + min(v + (0 if a == b else trans[p, n][f"{a}->{b}"]) for a, v in best.items())
                for b in choices[n]}
    return min(best.values())


def _plan(tmp_path, data: dict, *args: str) -> dict:
    prob, out = tmp_path / "p.json", tmp_path / "plan.json"
    prob.write_text(json.dumps(data))
    assert main(["layout", str(prob), "-o", str(out), *args]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("seed", range(6))
def test_exact_matches_exhaustive_on_small_dags(tmp_path, seed):
    rng = random.Random(1000 + seed)
    layouts = ["nchw", "nhwc", "chwn"][: 2 + seed % 2]
    data = _random_file(rng, 7 if len(layouts) == 3 else 10, layouts, chain=False)
    truth = _exhaustive(data)
    plan = _plan(tmp_path, data, "--method", "all", "--time-limit", "5")
    assert plan["status"] == "optimal" and plan["method"] == "frontier"
    assert plan["time"] == pytest.approx(_time(data, plan["layouts"]), rel=1e-12)
    assert plan["time"] == pytest.approx(truth, rel=1e-6)
    assert plan["bound"] <= plan["time"] + 1e-12 and plan["bound"] >= truth * (1 - 1e-6)
    cp = _plan(tmp_path, data, "--method", "cpsat")
    assert cp["status"] == "optimal" and cp["time"] == pytest.approx(truth, rel=1e-6)
    assert cp["time"] == pytest.approx(_time(data, cp["layouts"]), rel=1e-12)
    bt = plan["baselines"]["backtrack"]
    assert bt["status"] == "optimal" and bt["time"] == pytest.approx(truth, rel=1e-9) and bt["nodes_explored"] > 0
    for lay in layouts:
        single = plan["baselines"][f"all_{lay}"]
        assert single["time"] == pytest.approx(_time(data, single["layouts"]), rel=1e-12)
        assert single["time"] >= truth - 1e-9
    assert plan["baselines"]["best_single"]["time"] == pytest.approx(
        min(plan["baselines"][f"all_{lay}"]["time"] for lay in layouts))
    for nd in data["nodes"]:
        if "fixed" in nd:
            assert plan["layouts"][nd["id"]] == nd["fixed"]


@pytest.mark.parametrize("seed", range(4))
def test_chain_dp_matches_test_dp(tmp_path, seed):
    rng = random.Random(2000 + seed)
    data = _random_file(rng, 40, ["nchw", "nhwc", "chwn"], chain=True)
    rng.shuffle(data["nodes"])  # file order need not be topological
    plan = _plan(tmp_path, data)
    assert plan["method"] == "dp" and plan["status"] == "optimal"
    assert plan["time"] == pytest.approx(_chain_dp({**data, "nodes": sorted(data["nodes"], key=lambda nd: int(nd["id"][1:]))}), rel=1e-9)
    assert plan["time"] == pytest.approx(_time(data, plan["layouts"]), rel=1e-12)
    cp = _plan(tmp_path, data, "--method", "cpsat")
    assert cp["status"] == "optimal" and cp["time"] == pytest.approx(plan["time"], rel=1e-6)


@pytest.mark.parametrize("bad, message", [
    ({"edges": [{"src": "a", "dst": "zz", "transform": {}}]}, "undefined node 'zz'"),
    ({"edges": [{"src": "a", "dst": "b", "transform": {"nchw->nhwc": 1, "nhwc->nchw": 1}},
                {"src": "b", "dst": "a", "transform": {"nchw->nhwc": 1, "nhwc->nchw": 1}}]}, "cycle through node 'a'"),
    ({"edges": [{"src": "a", "dst": "b", "transform": {"nchw->nhwc": 1}}]}, "lacks transform 'nhwc->nchw'"),
    ({"nodes": [{"id": "a", "cost": {"nchw": -1, "nhwc": 1}}]}, "node 'a' cost 'nchw'"),
])
def test_bad_input_exits_2_naming_the_node_and_writes_nothing(tmp_path, bad, message):
    data = {"layouts": ["nchw", "nhwc"], "nodes": [{"id": "a", "cost": {"nchw": 1, "nhwc": 2}},
                                                   {"id": "b", "cost": {"nchw": 1, "nhwc": 2}}], "edges": [], **bad}
    prob, out = tmp_path / "p.json", tmp_path / "plan.json"
    prob.write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, "-m", "trainplan.cli", "layout", str(prob), "-o", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and message in proc.stderr and str(prob) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_frontier_dp_on_wide_random_dags_matches_cpsat():
    from trainplan.layout.solve import cpsat, frontier_dp
    from trainplan.layout.synthetic import random_problem

    for seed in range(3):
        problem = random_problem(60, seed=seed, layouts=("a", "b", "c"), skip_prob=0.6)
        exact, cp = frontier_dp(problem), cpsat(problem, time_limit=20)
        assert cp.status == "optimal" and exact.time == pytest.approx(cp.time, rel=1e-6)


def test_backtracking_time_limit_reports_feasible():
    from trainplan.layout.solve import backtrack
    from trainplan.layout.synthetic import random_problem

    problem = random_problem(300, seed=3, layouts=("a", "b", "c"))
    plan = backtrack(problem, time_limit=0.2)
    assert plan.solve_time_s < 0.2 * 3
    assert plan.status in ("optimal", "feasible") and plan.bound <= plan.time
