"""Fused groups as ops of the training step (trainplan.fuse.fused_ops): the traced step of the fused model has one
forward node and one backward node per fused group, trains as eager does, and is planned, recomputed and
executed by trainplan.plan unchanged; a group Inductor compiles gives the same gradients within round-off, one it
fails on runs as its fx graphs; a group writing its inputs in place (batch norm's running statistics) does so
outside its op; model '<model>+<target>' (trainplan.fuse.planned) builds from its spec, the same traced step in
every build."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

import trainplan
from tests.conftest import SMALL_CNN, TINY_GPT2
from trainplan.execute import GraphLayout, run_plan, stage_layouts
from trainplan.execute.predict import predict
from trainplan.export.tables import graph_tables
from trainplan.export.trace import trace_training_step
from trainplan.fuse.forward import trace_forward
from trainplan.fuse.fused_ops import NAMESPACE, _runner, fuse_model
from trainplan.fuse.planned import fused_spec
from trainplan.fuse.support import inductor_table
from trainplan.fuse.train_step import partition_forward
from trainplan.models import build_model

TINY = {**TINY_GPT2, "inputs": {"batch_size": 4, "seq_len": 32}}  # activations dominate: 0.6 recomputes


@pytest.fixture(scope="module")
def fused():
    """Tiny GPT-2, an untouched copy, and the model with its forward groups fused (fx graphs, no Inductor)."""
    built = build_model("tiny_gpt2", TINY, seed=0)
    reference = copy.deepcopy(built.module)
    groups, _ = partition_forward(trace_forward(built), inductor_table())
    return built, reference, groups, fuse_model(built, groups, compile_with_inductor=False)


def _fused_nodes(gm: torch.fx.GraphModule) -> Counter[str]:
    return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function" and NAMESPACE in str(n.target))


def test_each_fused_group_is_one_forward_and_one_backward_node(fused):
    built, _, groups, model = fused
    assert len(model.fused) >= 10 and len(model.fused) + len(model.unfused) == sum(len(g["nodes"]) >= 2 for g in groups)
    assert all("views of its inputs" in u["error"] for u in model.unfused)  # only view-only groups stay as ops
    traced, _ = trace_training_step(model.built)
    nodes = _fused_nodes(traced.gm)
    assert set(nodes.values()) == {1}
    names = {f["op"] for f in model.fused}
    assert {n.split(".")[1].removesuffix("_fwd") for n in nodes if "_fwd" in n} == names
    backward = {n.split(".")[1].removesuffix("_bwd") for n in nodes if "_bwd" in n}
    assert backward and backward <= names  # groups that only make masks or positions have no backward
    raw, _ = trace_training_step(built)
    fused_ops = sum(1 for n in traced.gm.graph.nodes if n.op == "call_function")
    assert fused_ops + sum(f["n_ops"] for f in model.fused) > sum(1 for n in raw.gm.graph.nodes if n.op == "call_function")
    assert fused_ops < 0.8 * sum(1 for n in raw.gm.graph.nodes if n.op == "call_function")


def test_the_fused_model_trains_as_eager(fused):
    built, reference, _, model = fused
    eager = copy.deepcopy(reference)
    for p in built.module.parameters():
        p.grad = None
    loss = model.built.module(**built.batch)
    loss.backward()
    want = eager(**built.batch).loss
    want.backward()
    torch.testing.assert_close(loss, want)
    for (name, a), b in zip(built.module.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_a_plan_on_the_fused_graph_recomputes_fused_ops_and_trains_as_eager(fused, tmp_path):
    built, reference, _, model = fused
    planned = trainplan.plan(model.built.module, built.batch, 0.6, time_limit_s=4, progress=False, cache_dir=tmp_path,
                             on_infeasible="raise_budget")  # a fused op is recomputed whole: 0.6 is below its floor
    assert planned.report.planned_budget_bytes < planned.report.no_recompute_peak_bytes
    stage = planned.step.stages[0]
    computes = Counter(o for kind, o in stage.events if kind == "compute")
    nodes = {op["id"]: op["nodes"] for op in stage.raw["ops"]}
    by_name = {n.name: n for n in planned.step.traced.gm.graph.nodes}
    rerun = [o for o, c in computes.items() if c > 1]
    assert any(NAMESPACE in str(by_name[n].target) for o in rerun for n in nodes[o]), rerun
    eager = copy.deepcopy(reference)
    for p in built.module.parameters():
        p.grad = None
    loss = planned(built.batch)
    loss.backward()
    want = eager(**built.batch).loss
    want.backward()
    torch.testing.assert_close(loss, want)
    for a, b in zip(built.module.parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_an_inductor_compiled_group_gives_eagers_gradients(fused):
    built, reference, groups, _ = fused
    largest = max(groups, key=lambda g: len(g["nodes"]))
    model = fuse_model(built, [largest], compile_with_inductor=True)
    assert [f["group"] for f in model.fused] == [largest["id"]]
    _assert_eagers_gradients(built, reference, model, rtol=1e-4, atol=1e-6)


def test_a_compiled_half_takes_its_traced_layouts_and_copies_only_other_ones(monkeypatch):
    """Inductor compiles a half for the layouts it was traced with (a transposed weight stays transposed; an
    expanded input, which no dense layout holds, is compiled as contiguous): inputs in those layouts reach the
    compiled code as they are, inputs in another layout (an executor's copy of a view) are copied into them, and
    both give the fx graph's values."""
    real, calls = torch._inductor.compile, []

    def spy(gm, example):
        compiled = real(gm, example)
        return lambda *args: (calls.append(args), compiled(*args))[1]

    monkeypatch.setattr(torch._inductor, "compile", spy)
    gm = torch.fx.symbolic_trace(lambda x, w, b: (torch.relu(x @ w + b),))  # a half returns a tuple
    x, w = torch.randn(4, 8), torch.randn(16, 8).t()  # w: a linear layer's transposed weight
    b = torch.randn(16).expand(4, 16)
    expected = gm(x, w, b)[0]
    run = _runner(gm, [x, w, b], compile_with_inductor=True)
    torch.testing.assert_close(run([x, w, b])[0], expected)  # as traced (b: copied, contiguous)
    torch.testing.assert_close(run([x, w.contiguous(), b.contiguous()])[0], expected)  # w copied back
    (_, traced_w, traced_b), (_, copied_w, plain_b) = calls
    assert traced_w is w and copied_w.stride() == w.stride() == (1, 8)
    assert traced_b.stride() == plain_b.stride() == (16, 1)


def test_a_group_inductor_fails_on_runs_as_its_fx_graphs(fused, monkeypatch):
    built, reference, groups, _ = fused
    largest = max(groups, key=lambda g: len(g["nodes"]))

    def refuse(*_args, **_kwargs):
        raise RuntimeError("no kernel for you\nsecond line")

    monkeypatch.setattr(torch._inductor, "compile", refuse)
    model = fuse_model(built, [largest], compile_with_inductor=True)
    assert model.fused == [{"group": largest["id"], "n_ops": len(largest["nodes"]), "op": model.fused[0]["op"],
                            "runs": "fx", "inductor_error": "RuntimeError: no kernel for you"}]
    assert model.built.module.fusion["groups_fx"] == 1
    _assert_eagers_gradients(built, reference, model)


def _assert_eagers_gradients(built, reference, model, **tolerance) -> None:
    """One backward of the fused ``model`` gives the gradients of an eager copy of ``reference``."""
    eager = copy.deepcopy(reference)
    for p in built.module.parameters():
        p.grad = None
    model.built.module(**built.batch).backward()
    eager(**built.batch).loss.backward()
    for a, b in zip(built.module.parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, **tolerance)


def test_a_fused_models_spec_builds_the_same_traced_step_as_fusing_by_hand(fused):
    """build_model on the fused spec (what every rule of the workflow builds for '<model>+<target>'): the weights
    and batch of the raw model, the groups of forward_groups, fused ops named as when fused by hand."""
    built, reference, _, model = fused
    spec = fused_spec("tiny_gpt2", TINY, {"builtin": "inductor"}, seed=0, compiler="fx")
    again = build_model("tiny_gpt2+inductor", spec, seed=0)
    assert again.module.fusion["groups_fused"] == len(model.fused) and again.module.fusion["groups_fx"] == len(model.fused)
    assert all(torch.equal(again.batch[k], v) for k, v in built.batch.items())
    for a, b in zip(again.module.model.parameters(), reference.parameters()):
        assert torch.equal(a, b)
    mine, theirs = trace_training_step(again)[0].gm.graph.nodes, trace_training_step(model.built)[0].gm.graph.nodes
    assert [(n.name, str(n.target)) for n in mine] == [(n.name, str(n.target)) for n in theirs]


def test_a_group_with_batch_norm_updates_the_running_statistics_outside_its_op(tmp_path):
    """The small CNN's stem-to-pooling group holds two batch norms in training mode: its forward op returns their
    new running statistics and the call copies them in (traced as one _foreach_copy_ node, so that the problem
    holds the four as one op), once per step, planned or not."""
    spec = fused_spec("small_cnn", SMALL_CNN, {"builtin": "inductor"}, seed=0, compiler="fx")
    model = build_model("small_cnn+inductor", spec, seed=0)
    raw = build_model("small_cnn", SMALL_CNN, seed=0)
    assert model.module.fusion["groups_fused"] == 2 and model.module.fusion["groups_unfused"] == 0
    assert all(torch.equal(a, b) for a, b in zip(model.module.model.buffers(), raw.module.buffers()))  # build: untouched
    traced, _ = trace_training_step(model)
    copies = [n for n in traced.gm.graph.nodes if n.target == torch.ops.aten._foreach_copy_.default]
    assert len(copies) == 1 and len(copies[0].args[0]) == 4  # 2 x mean and var
    assert not any(n.target == torch.ops.aten.copy_.default for n in traced.gm.graph.nodes)
    # no gradient is made for the statistics (no zeros in backward: ResNet-50's fused step had 106)
    assert not any(n.target == torch.ops.aten.zeros.default for n in traced.gm.graph.nodes)
    planned = trainplan.plan(model.module, model.batch, 0.8, time_limit_s=2, progress=False, cache_dir=tmp_path,
                             on_infeasible="raise_budget")
    loss = planned(model.batch)
    loss.backward()
    want = raw.loss_fn(raw.module(**raw.batch))
    want.backward()
    torch.testing.assert_close(loss, want)
    for (name, a), b in zip(model.module.model.named_parameters(), raw.module.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    for (name, a), b in zip(model.module.model.named_buffers(), raw.module.buffers()):
        torch.testing.assert_close(a, b, msg=name)
    # the fused forward's further outputs (what its backward saves) are held from its compute on: predicted so
    stages, (traced, flat) = planned.step.stages, trace_training_step(model)
    layout = GraphLayout.build(traced.gm, [t.detach() for t in flat], graph_tables(traced).tensors)
    run = run_plan(stage_layouts(stages, layout), [st.events for st in stages], layout, traced.gm,
                   device=torch.device("cpu"), measure=True)
    assert [r.bytes_after for r in run.records] == predict(stages[0].problem, stages[0].events).bytes_after
    assert any(op.get("of", "").endswith("_fwd") for op in stages[0].raw["ops"])
    # the four statistics, read by the one copy alone, are one further output of the forward op
    (copy_op,) = [op for op in stages[0].raw["ops"] if copies[0].name in op["nodes"]]
    (statistics,) = copy_op["inputs"]
    assert stages[0].raw["ops"][[op["id"] for op in stages[0].raw["ops"]].index(statistics)].get("of", "").endswith("_fwd")
