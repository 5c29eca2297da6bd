"""A plan compiled into straight-line fx code runs as the event interpreter does, event by event."""

from __future__ import annotations

import torch

import pytest

from tests.test_execute import middle_cut, mlp, no_recompute, plan_for, reference, swap_and_recompute  # noqa: F401 (fixture)
from trainplan.aten_ops import is_inplace
from trainplan.execute import GraphLayout, parse_plan, run_plan, stage_layouts
from trainplan.execute.compile import compile_plan, free, probe_run, swap_in, swap_out
from trainplan.export.tables import graph_tables
from trainplan.export.trace import trace_training_step
from trainplan.models import build_model


def both(traced, flat, tables, plan):
    """The interpreter's measured run and the probed compiled run of ``plan``."""
    stages = parse_plan(plan)
    flat = [t.detach() for t in flat]
    layout = GraphLayout.build(traced.gm, flat, tables.tensors)
    layouts = stage_layouts(stages, layout)
    events = [s.events for s in stages]
    interpreted = run_plan(layouts, events, layout, traced.gm, device=torch.device("cpu"), measure=True)
    compiled = compile_plan(traced.gm, layout, layouts, events, device=torch.device("cpu"), probe=True)
    outputs, probe = probe_run(compiled, layout, layouts, flat)
    return interpreted, compiled, outputs, probe


def assert_same_run(interpreted, outputs, probe, want) -> None:
    assert len(probe.after) == len(interpreted.records)
    for rec, (stage, position, nbytes, sids) in zip(interpreted.records, probe.after):
        assert (rec.stage, rec.position) == (stage, position)
        assert sids == rec.storages, (rec.position, rec.kind, rec.op, sorted(sids ^ rec.storages))
        assert nbytes == rec.bytes_after, (rec.position, rec.kind, rec.op)
    for got, interp, ref in zip(outputs, interpreted.outputs, want):
        assert torch.equal(got, ref) and torch.equal(got, interp)


@pytest.mark.parametrize("model", ["small_cnn", "tiny_gpt2", "mlp"])
@pytest.mark.parametrize("events_of", [no_recompute, swap_and_recompute])
def test_compiled_plan_frees_the_same_storages_at_the_same_events(model, events_of, request):
    _, traced, flat, tables = request.getfixturevalue(model)
    plan = plan_for(tables, [tables.nodes.name.tolist()], events_of)
    interpreted, compiled, outputs, probe = both(traced, flat, tables, plan)
    assert_same_run(interpreted, outputs, probe, reference(traced, flat))
    targets = [n.target for n in compiled.module.graph.nodes if n.op == "call_function"]
    n_recomputes = sum(1 for r in interpreted.records if r.kind == "compute") - sum(
        1 for op in plan["stages"][0]["problem"]["ops"])
    assert (targets.count(swap_out) > 0) == (events_of is swap_and_recompute) == (n_recomputes > 0)
    assert targets.count(swap_in) == sum(1 for r in interpreted.records if r.kind == "swap_in")
    assert targets.count(free) == sum(1 for r in interpreted.records if r.kind == "free") + 1


def test_two_compiled_stages_match_the_interpreter(small_cnn):
    _, traced, flat, tables = small_cnn
    names = tables.nodes.name.tolist()
    cut = middle_cut(tables)
    plan = plan_for(tables, [names[:cut], names[cut:]], swap_and_recompute)
    interpreted, _, outputs, probe = both(traced, flat, tables, plan)
    assert {s for s, *_ in probe.after} == {0, 1}
    assert_same_run(interpreted, outputs, probe, reference(traced, flat))


def test_an_unprobed_compiled_plan_has_no_calls_between_the_ops(mlp):
    _, traced, flat, tables = mlp
    stages = parse_plan(plan_for(tables, [tables.nodes.name.tolist()], swap_and_recompute))
    layout = GraphLayout.build(traced.gm, [t.detach() for t in flat], tables.tensors)
    layouts = stage_layouts(stages, layout)
    compiled = compile_plan(traced.gm, layout, layouts, [s.events for s in stages], device=torch.device("cpu"))
    graph_ops = {n.target for n in traced.gm.graph.nodes if n.op == "call_function"}
    extra = {n.target for n in compiled.module.graph.nodes if n.op == "call_function"} - graph_ops
    assert extra <= {free, swap_out, swap_in, __import__("trainplan.execute.compile", fromlist=["view"]).view}
    assert all(torch.equal(a, b) for a, b in zip(compiled(*flat), reference(traced, flat)))


def inplace_residual(channels: int = 4, image_size: int = 8, batch_size: int = 2, classes: int = 3):
    """Conv, batch norm, the conv's output added in place into the batch norm's (as transformers' ResNet does:
    ``hidden_state += residual``), ReLU and a linear head; batch: ``x`` and ``labels``."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(channels)
            self.head = torch.nn.Linear(channels, classes)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            h = self.conv(x)
            y = self.bn(h)
            y += h
            return torch.nn.functional.cross_entropy(self.head(torch.relu(y).mean(dim=(2, 3))), labels)

    gen = torch.Generator().manual_seed(0)
    return Net(), {"x": torch.randn(batch_size, 3, image_size, image_size, generator=gen),
                   "labels": torch.randint(0, classes, (batch_size,), generator=gen)}


def test_a_storage_written_in_place_is_handed_on_after_the_write():
    """Stage 0 ends with the residual ``add_`` into the batch norm's output and stage 1 reads the sum: the
    hand-off carries the value after the ``add_``, in both executors (the compiled plan sent the batch norm's
    value, and its gradients were wrong on ResNet-50 split in two)."""
    spec = {"source": "callable", "callable": "tests.test_execute_compile:inplace_residual", "kwargs": {}}
    traced, flat = trace_training_step(build_model("inplace_residual", spec, seed=0))
    tables = graph_tables(traced)
    names = tables.nodes.name.tolist()
    add = next(n for n in traced.gm.graph.nodes  # the residual (not the batch norm's counter, a graph input)
               if n.target is torch.ops.aten.add_.Tensor and n.args[0].op != "placeholder")
    assert is_inplace(str(add.target))
    plan = plan_for(tables, [names[:names.index(add.name) + 1], names[names.index(add.name) + 1:]], no_recompute)
    interpreted, _, outputs, probe = both(traced, flat, tables, plan)
    layouts = stage_layouts(parse_plan(plan), GraphLayout.build(traced.gm, [t.detach() for t in flat], tables.tensors))
    assert any(add.name in [n.name for n in layouts[0].ops[op].nodes] for op in layouts[0].sends)
    assert_same_run(interpreted, outputs, probe, reference(traced, flat))
