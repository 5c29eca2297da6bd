"""The fused graph as the planning graph: every group one node, and plans on it run the real step."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from tests.test_execute import no_recompute, plan_for, reference, swap_and_recompute
from tests.test_execute_compile import assert_same_run, both
from trainplan.artifacts import NODE_COLUMNS, TENSOR_COLUMNS
from trainplan.fuse.coarsen import coarsen
from trainplan.fuse.plan_compare import compare_table, plan_row
from trainplan.fuse.stage import fuse_exported
from trainplan.fuse.support import inductor_table
from trainplan.partition import partition_graph, pipeline_graph, range_tables
from trainplan.schedule import problem_from_dict, replay
from trainplan.schedule.stage_problem import stage_problem


def fused(tables):
    """The coarse graph of ``tables`` on the Inductor table, with stand-in op times 1..n microseconds."""
    ops = pd.DataFrame({"name": tables.nodes.name, "time_s": 1e-6 * (1 + pd.RangeIndex(len(tables.nodes))),
                        "recompute_s": 0.0, "transfer_s": 0.0})
    groups = fuse_exported(tables.nodes, tables.tensors, ops, inductor_table(), fx_max_nodes=0).document["groups"]
    return ops, groups, coarsen(tables.nodes, tables.tensors, ops, groups)


@pytest.mark.parametrize("model", ["tiny_gpt2", "small_cnn"])
def test_every_node_is_in_one_coarse_node_and_the_tables_stay_a_graph(model, request):
    _, _, _, tables = request.getfixturevalue(model)
    ops, groups, coarse = fused(tables)
    multi = [g for g in groups if len(g["nodes"]) >= 2]
    assert multi and coarse.stats["groups_contracted"] == len(multi)
    assert len(coarse.nodes) == len(tables.nodes) - sum(len(g["nodes"]) for g in multi) + len(multi)
    covered = [m for members in coarse.nodes.members.dropna() for m in members]
    raw = coarse.nodes.loc[coarse.nodes.members.isna(), "name"].tolist()
    assert sorted(covered + raw) == sorted(tables.nodes.name)
    assert set(NODE_COLUMNS) <= set(coarse.nodes.columns) and set(TENSOR_COLUMNS) <= set(coarse.tensors.columns)
    known = set(coarse.tensors.tensor_id)
    assert all(t in known for ts in coarse.nodes.inputs for t in ts)
    assert all(t in known for ts in coarse.nodes.outputs for t in ts)
    position = {name: i for i, name in enumerate(coarse.nodes.name)}
    made_by = dict(zip(coarse.tensors.tensor_id, coarse.tensors.node))
    for name, ins in zip(coarse.nodes.name, coarse.nodes.inputs):  # the table order is still topological
        assert all(made_by[t] not in position or position[made_by[t]] < position[name] for t in ins)
    # internal storages: allocated inside a group and read by nothing outside it, and gone from the tables
    internal = {s for ss in coarse.nodes.internal_storages.dropna() for s in ss}
    assert not internal & set(coarse.tensors.storage)
    assert coarse.ops.time_s.sum() == pytest.approx(ops.time_s.sum())
    assert coarse.stats["ops_coarse"] == len(coarse.nodes) == len(coarse.ops)


def test_a_group_with_internal_storages_holds_them_as_workspace(tiny_gpt2):
    _, _, _, tables = tiny_gpt2
    _, _, coarse = fused(tables)
    nodes = coarse.nodes.merge(coarse.ops[["name", "time_s"]], on="name")
    raw = stage_problem(nodes, coarse.tensors, nodes.name.tolist(), bandwidth=1e9)
    with_internal = [op for op in raw["ops"] if op.get("internal")]
    assert with_internal, "tiny GPT-2 has a group whose intermediate never leaves it"
    sizes = dict(zip(tables.tensors.storage, tables.tensors.storage_bytes))
    for op in with_internal:
        row = coarse.nodes.set_index("name").loc[op["id"]]
        assert op["nodes"][: len(row.members)] == list(row.members)  # then any views folded into it
        assert op["workspace"] >= sum(sizes[s] for s in op["internal"]) == row.internal_bytes
    assert len(raw["ops"]) < len(stage_problem(tables.nodes.assign(time_s=1e-6), tables.tensors,
                                               tables.nodes.name.tolist(), bandwidth=1e9)["ops"])


@pytest.mark.parametrize("model", ["tiny_gpt2", "small_cnn"])
@pytest.mark.parametrize("events_of", [no_recompute, swap_and_recompute])
def test_plans_on_the_fused_graph_run_the_real_step(model, events_of, request):
    """Partitioned into 2 stages on the coarse graph; the interpreter and the compiled plan give the
    unmodified step's loss and gradients bit for bit, free the same storages at the same events, and never
    hold more than the plan's replayed peak."""
    _, traced, flat, tables = request.getfixturevalue(model)
    _, _, coarse = fused(tables)
    nodes = coarse.nodes.merge(coarse.ops[["name", "time_s"]], on="name")
    graph = pipeline_graph(nodes, coarse.tensors)
    part = partition_graph(graph, range_tables(graph), 2, tolerance=0.02)
    plan = plan_for(coarse, [list(s.nodes) for s in part.stages], events_of)
    interpreted, _, outputs, probe = both(traced, flat, tables, plan)
    assert_same_run(interpreted, outputs, probe, reference(traced, flat))
    for st in plan["stages"]:
        problem = problem_from_dict(st["problem"])
        events = [tuple(e) for e in st["schedule"]["events"]]
        measured = max(r.bytes_peak for r in interpreted.records if r.stage == st["index"] and not r.boundary)
        fixed = problem.fixed_bytes
        assert measured - fixed <= replay(problem, events).peak_bytes - fixed
    assert torch.equal(outputs[0], reference(traced, flat)[0])


def _case(graph: str, time: float, events: list[list[str]]) -> dict:
    stage = {"time_s": time, "budget_bytes": 10, "peak_bytes": 9, "schedule": {"events": events, "recomputes": 1}}
    problem = {"ops": [{"id": "a"}, {"id": "fused_3"}, {"id": "in:x", "boundary": True}]}
    return {"model": "m", "graph": graph, "partition": {"n_ops": 7 if graph == "raw" else 5},
            "schedules": {"stages": [{"problem": problem, "schedule": {"solve_seconds": 2.0 if graph == "raw" else 1.0}}]},
            "plan": {"k": 1, "budget_fraction": 0.5, "stages": [stage],
                     "balance": {"t_max_s": time, "gpipe_step_time_s": 8 * time}},
            "validation": {"status": "passed", "measured_time_s": time * 1.01}}


def test_plan_comparison_costs_each_compute_of_a_timed_group_at_its_fused_time():
    events = [["compute", "a"], ["compute", "fused_3"], ["free", "fused_3"], ["compute", "fused_3"]]
    coarse_ops = pd.DataFrame({"name": ["a", "fused_3"], "time_s": [1.0, 0.5], "fused_s": [float("nan"), 0.2]})
    table = compare_table([plan_row(**_case("raw", 2.0, events)),
                           plan_row(**_case("inductor", 2.0, events), coarse_ops=coarse_ops)])
    fused = table.set_index("graph").loc["inductor"]
    assert fused.planned_fused_kernels_s == pytest.approx(2.0 - 2 * (0.5 - 0.2))  # computed twice (a recompute)
    assert fused.problem_ops == 2 and fused.solve_s_vs_raw == pytest.approx(0.5)
    assert fused.planned_s_vs_raw == pytest.approx(1.0) and fused.graph_ops == 5
    assert pd.isna(table.set_index("graph").loc["raw", "planned_fused_kernels_s"])
