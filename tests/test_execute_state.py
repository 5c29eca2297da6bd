"""A recompute leaves the step's fixed state alone: batch norm's running statistics and step counter move once
per step, as in eager, in the interpreter and in the compiled plan alike."""

from __future__ import annotations

import pytest
import torch

from tests.test_execute import no_recompute, plan_for, reference
from trainplan.execute import GraphLayout, parse_plan, run_plan, stage_layouts
from trainplan.execute.compile import compile_plan
from trainplan.execute.state import rerun, written_args
from trainplan.schedule.replay import replay


def recompute_batch_norm(problem) -> list[tuple[str, str]]:
    """No-recompute events, then the first batch norm (and the ReLU after it) dropped and recomputed before
    the first convolution backward reads the ReLU again, and the step counter's ``add_`` run again."""
    events = no_recompute(problem)
    last_forward = max(i for i, e in enumerate(events) if e == ("compute", "add"))
    events.insert(last_forward + 1, ("free", "relu"))
    before = events.index(("compute", "convolution_backward"))
    events[before:before] = [("compute", "native_batch_norm"), ("compute", "relu"), ("free", "native_batch_norm"),
                             ("compute", "add_")]
    return events


def fresh(flat: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().clone() for t in flat]


@pytest.mark.parametrize("run", ["interpreter", "compiled"])
def test_a_recomputed_batch_norm_updates_its_running_statistics_once(small_cnn, run):
    _, traced, flat, tables = small_cnn
    plan = plan_for(tables, [tables.nodes.name.tolist()], recompute_batch_norm)
    stages = parse_plan(plan)
    computes = [op for kind, op in stages[0].events if kind == "compute"]
    assert computes.count("native_batch_norm") == computes.count("add_") == 2
    assert replay(stages[0].problem, stages[0].events).recomputes >= 3
    eager_inputs, plan_inputs = fresh(flat), fresh(flat)
    want = reference(traced, eager_inputs)  # the traced step run once: each buffer updated once
    layout = GraphLayout.build(traced.gm, plan_inputs, tables.tensors)
    layouts = stage_layouts(stages, layout)
    if run == "interpreter":
        got = run_plan(layouts, [stages[0].events], layout, traced.gm, device=torch.device("cpu")).outputs
    else:
        got = compile_plan(traced.gm, layout, layouts, [stages[0].events], device=torch.device("cpu"))(*plan_inputs)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    n_p, n_b = len(traced.param_names), len(traced.buffer_names)
    buffers = slice(n_p, n_p + n_b)
    assert [b.tolist() for b in plan_inputs[buffers]] == [b.tolist() for b in eager_inputs[buffers]]
    assert any(not torch.equal(a, b) for a, b in zip(eager_inputs[buffers], fresh(flat)[buffers]))


def test_the_writes_of_batch_norm_and_in_place_ops_are_known(small_cnn):
    """``native_batch_norm`` writes its running statistics without saying so in its schema; ``add_`` on the
    step counter is skipped on a rerun, batch norm gets copies of the statistics."""
    _, traced, flat, tables = small_cnn
    layout = GraphLayout.build(traced.gm, fresh(flat), tables.tensors)
    nodes = {n.name: n for n in traced.gm.graph.nodes}
    assert written_args(torch.ops.aten.native_batch_norm.default) == (3, 4)
    assert written_args(torch.ops.aten._native_batch_norm_legit.default) == (3, 4)
    assert written_args(torch.ops.aten.add_.Tensor) == (0,)
    assert written_args(torch.ops.aten.convolution.default) == ()
    assert rerun(nodes["native_batch_norm"], layout).copies == (3, 4)
    assert not rerun(nodes["native_batch_norm"], layout).skip
    assert rerun(nodes["add_"], layout).skip
    assert rerun(nodes["convolution"], layout) is None
