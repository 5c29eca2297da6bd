"""Stage problems: storage-level ops whose in-order run reproduces the exported graph's memory timeline."""

from __future__ import annotations

import pytest

from trainplan.export.tables import memory_table
from trainplan.schedule import problem_from_dict
from trainplan.schedule.stage_problem import budget_for, no_recompute_peak, stage_problem


def _timed(tables):
    return tables.nodes.assign(time_s=1e-3)


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "small_cnn"])
def test_whole_graph_problem_matches_export_liveness(fixture, request):
    _, _, _, tables = request.getfixturevalue(fixture)
    raw = stage_problem(_timed(tables), tables.tensors, tables.nodes.name.tolist(), bandwidth=1e10)
    _, summary = memory_table(tables)
    assert raw["fixed_bytes"] == summary["fixed_bytes"]
    assert no_recompute_peak(raw) == summary["peak_bytes"]
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
