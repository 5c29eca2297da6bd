"""Stage problems: storage-level ops whose in-order run reproduces the exported graph's memory timeline."""

from __future__ import annotations

import pytest

from trainplan.export.tables import memory_table
from trainplan.schedule import problem_from_dict, replay, solve
from trainplan.schedule.stage_problem import budget_for, merge_further_outputs, no_recompute_peak, stage_problem


def _timed(tables):
    return tables.nodes.assign(time_s=1e-3)


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "small_cnn"])
def test_whole_graph_problem_matches_export_liveness(fixture, request):
    """The in-order peak is the export's liveness peak, once the temporaries a node holds inside its run
    (``workspace_bytes``: tiny GPT-2's ``embedding_grad_add``) are left out; with them, at most their largest more."""
    _, _, _, tables = request.getfixturevalue(fixture)
    nodes = _timed(tables)
    raw = stage_problem(nodes.assign(workspace_bytes=0), tables.tensors, nodes.name.tolist(), bandwidth=1e10)
    _, summary = memory_table(tables)
    assert raw["fixed_bytes"] == summary["fixed_bytes"]
    assert no_recompute_peak(raw) == summary["peak_bytes"]
    with_temporaries = no_recompute_peak(stage_problem(nodes, tables.tensors, nodes.name.tolist(), bandwidth=1e10))
    assert summary["peak_bytes"] <= with_temporaries <= summary["peak_bytes"] + nodes.workspace_bytes.max()
    # Every fx node runs in exactly one op, and every op's time is the sum of its nodes' times.
    members = [n for op in raw["ops"] for n in op["nodes"]]
    assert sorted(members) == sorted(tables.nodes.name)
    assert all(op["time"] == pytest.approx(1e-3 * len(op["nodes"])) for op in raw["ops"])
    # Gradients and the loss must stay on the device at the end; multi-output extras are never recomputed.
    assert len(raw["keep"]) >= 1
    assert all(not op["recompute"] for op in raw["ops"] if "#" in op["id"])
    problem_from_dict({**raw, "budget_bytes": budget_for(raw, 0.5)})  # a valid problem file


def test_budget_fraction_is_relative_to_activation_peak(small_cnn):
    _, _, _, tables = small_cnn
    raw = stage_problem(_timed(tables), tables.tensors, tables.nodes.name.tolist(), bandwidth=1e10)
    peak = no_recompute_peak(raw)
    assert budget_for(raw, 1.0) == peak
    assert budget_for(raw, 0.5) == raw["fixed_bytes"] + int(0.5 * (peak - raw["fixed_bytes"]))


def test_second_stage_receives_boundary_inputs(tiny_gpt2):
    _, _, _, tables = tiny_gpt2
    names = tables.nodes.name.tolist()
    raw = stage_problem(_timed(tables), tables.tensors, names[len(names) // 2 :], bandwidth=1e10)
    received = [op for op in raw["ops"] if op.get("boundary")]
    # Received storages cost no compute (only views of them taken in this stage) and cannot be recomputed.
    assert received and all(op["id"].startswith("in:") and not op["recompute"] for op in received)
    assert all(op["time"] == pytest.approx(1e-3 * len(op["nodes"])) for op in received)


def _extra(op_id: str, kernel: str, *, swap: bool = False, **flags) -> dict:
    return {"id": op_id, "time": 0.0, "bytes": 10, "inputs": [kernel], "recompute": False, "swap": swap,
            "nodes": [f"getitem_{op_id[-1]}"], "storages": [int(op_id[-1])], "phase": "forward", "of": kernel,
            **flags}


def test_further_outputs_no_schedule_tells_apart_become_one_op():
    ops = {op["id"]: op for op in [
        {"id": "k", "time": 1.0, "bytes": 10, "inputs": [], "recompute": True, "swap": False, "nodes": ["k"],
         "storages": [0], "phase": "forward"},
        _extra("k#1", "k"), _extra("k#2", "k"), _extra("k#3", "k"), _extra("k#4", "k", swap=True),
        _extra("k#5", "k"), _extra("k#6", "k", gradient=True),
        {"id": "a", "time": 1.0, "bytes": 10, "inputs": ["k#1", "k#2", "k#4"], "recompute": True, "swap": False,
         "nodes": ["a"], "storages": [7], "phase": "backward"},
        {"id": "b", "time": 1.0, "bytes": 10, "inputs": ["k#3"], "recompute": True, "swap": False, "nodes": ["b"],
         "storages": [8], "phase": "backward"},
    ]}
    keep = merge_further_outputs(ops, ["k#5", "k#6", "b"])
    # k#1 and k#2: read by a alone, kept alike -> one op of both storages; k#3 (read by b), k#4 (may be swapped),
    # k#5 and k#6 (kept, marked apart) stay
    assert list(ops) == ["k", "k#1", "k#3", "k#4", "k#5", "k#6", "a", "b"]
    assert ops["k#1"]["storages"] == [1, 2] and ops["k#1"]["bytes"] == 20
    assert ops["k#1"]["nodes"] == ["getitem_1", "getitem_2"]
    assert ops["a"]["inputs"] == ["k#1", "k#4"]
    assert keep == ["k#5", "k#6", "b"]


def test_merged_problem_holds_what_the_unmerged_one_holds(tiny_gpt2):
    """Without swaps the further outputs merge; with swaps allowed they do not: the same storages, and the same
    peak and time when every op runs once in order."""
    _, _, _, tables = tiny_gpt2
    names = tables.nodes.name.tolist()
    apart = stage_problem(_timed(tables), tables.tensors, names, bandwidth=1e10)
    merged = stage_problem(_timed(tables), tables.tensors, names, bandwidth=1e10, swap=False)
    assert len(merged["ops"]) < len(apart["ops"])
    assert sorted(s for op in merged["ops"] for s in op["storages"]) == sorted(
        s for op in apart["ops"] for s in op["storages"])
    assert no_recompute_peak(merged) == no_recompute_peak(apart)
    assert sorted(n for op in merged["ops"] for n in op["nodes"]) == sorted(tables.nodes.name)
    assert sum(op["time"] for op in merged["ops"]) == pytest.approx(sum(op["time"] for op in apart["ops"]))
    assert sum(op["bytes"] for op in merged["ops"]) == sum(op["bytes"] for op in apart["ops"])
    assert problem_from_dict({**merged, "budget_bytes": budget_for(merged, 0.5)}).n == len(merged["ops"])


def test_a_schedule_of_the_merged_problem_runs_the_same_on_the_unmerged_one(tiny_gpt2):
    """A schedule with recomputes, solved on the merged problem and expanded to the further outputs apart (each merged
    op's events on every op it holds, in order), replays on the unmerged problem without swaps to the same time and
    peak: the merge hides no choice a schedule has."""
    _, _, _, tables = tiny_gpt2
    names = tables.nodes.name.tolist()
    merged = stage_problem(_timed(tables), tables.tensors, names, bandwidth=1e10, swap=False)
    apart = stage_problem(_timed(tables), tables.tensors, names, bandwidth=1e10)
    for op in apart["ops"]:
        op["swap"] = False
    budget = budget_for(merged, 0.6)
    schedule = solve(problem_from_dict({**merged, "budget_bytes": budget}), 5.0, 1, 0)
    assert schedule.ok and sum(kind == "compute" for kind, _ in schedule.events) > len(merged["ops"])  # recomputes
    assert len(merged["ops"]) < len(apart["ops"])
    kept = {op["id"] for op in merged["ops"]}
    holds = {op["id"]: [op["id"]] + [a["id"] for a in apart["ops"] if a["id"] not in kept and a["storages"][0] in
                                     op["storages"]] for op in merged["ops"]}
    events = [(kind, held) for kind, op_id in schedule.events for held in holds[op_id]]
    again = replay(problem_from_dict({**apart, "budget_bytes": schedule.budget_bytes}), events)
    assert again.time == pytest.approx(schedule.time) and again.peak_bytes == schedule.peak_bytes
