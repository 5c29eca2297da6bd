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
from trainplan import direct_kernels
from trainplan.execute import GraphLayout, run_plan, stage_layouts
from trainplan.execute.predict import predict
from trainplan.export.tables import graph_tables
from trainplan.export.trace import trace_training_step
from trainplan.fuse import fused_ops
from trainplan.fuse.forward import forward_groups, trace_forward
from trainplan.fuse.fused_ops import NAMESPACE, _runner, fuse_model
from trainplan.fuse.planned import UNFUSED_OPS, float64_check, fused_spec, gradients_vs_unfused
from trainplan.fuse.support import inductor_table, without
from trainplan.fuse.train_step import partition_forward
from trainplan.models import BuiltModel, build_model
from trainplan.schedule.stage_problem import stage_problem

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


def test_a_half_compiled_from_inputs_requiring_grad_is_an_inference_graph():
    """A backward half's example holds parameters, which require grad: compiled from them as they are, Inductor
    builds a training graph of the half (its outputs carrying an autograd graph and the tensors saved for it);
    the runner compiles it for inference, so the outputs hold nothing beyond their values."""
    gm = torch.fx.symbolic_trace(lambda x, w: (torch.relu(x @ w), x.sin()))
    x, w = torch.randn(4, 8), torch.randn(8, 16, requires_grad=True)
    run = _runner(gm, [x, w], compile_with_inductor=True)
    for inputs in ([x, w], [x.requires_grad_(), w]):
        outs = run(inputs)
        assert [o.requires_grad for o in outs] == [False, False]
        torch.testing.assert_close(outs[0], torch.relu(x @ w).detach())


def test_a_half_with_a_convolution_runs_in_the_models_layout_without_transposes():
    """A group's inputs and outputs keep the model's (NCHW) layout: Inductor's layout optimisation, which runs a
    convolution channels-last, would transpose at the group's boundary (it does, compiled plainly)."""
    from torch._inductor.utils import run_and_get_code

    def block(x, w, g, b):
        y = torch.ops.aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        return (torch.relu(y * g.view(1, -1, 1, 1) + b.view(1, -1, 1, 1)),)

    gm = torch.fx.symbolic_trace(block)
    args = [torch.randn(2, 64, 28, 28), torch.randn(64, 64, 3, 3), torch.randn(64), torch.randn(64)]
    (out,), code = run_and_get_code(lambda: _runner(gm, args, compile_with_inductor=True)(args))
    _, plain = run_and_get_code(lambda: torch._inductor.compile(gm, args)(*args))
    assert not any("transpose_mxn" in c for c in code) and any("transpose_mxn" in c for c in plain)
    assert out.is_contiguous()
    torch.testing.assert_close(out, block(*args)[0], rtol=1e-4, atol=1e-4)


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


def test_a_fused_models_spec_builds_the_same_traced_step_as_fusing_by_hand():
    """build_model on the fused spec (what every rule of the workflow builds for '<model>+<target>'): the weights
    and batch of the raw model, the groups of forward_groups for the table less UNFUSED_OPS, fused ops named as
    when fused by hand."""
    built = build_model("tiny_gpt2", TINY, seed=0)
    reference = copy.deepcopy(built.module)
    groups, _ = partition_forward(trace_forward(built), without(inductor_table(), UNFUSED_OPS, "by-hand"))
    model = fuse_model(built, groups, compile_with_inductor=False)
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
    # the plan's code calls each fused op's Python kernel, not the op through the dispatcher
    fused = [n.target for n in traced.gm.graph.nodes if str(n.target).startswith("trainplan_fused.")]
    called = [n.target for n in planned.step.compiled.module.graph.nodes if n.op == "call_function"]
    assert fused and not any(str(t).startswith("trainplan_fused.") for t in called)
    assert all(direct_kernels.kernel(t) in called for t in fused) and direct_kernels.kernel(fused[0]) is not fused[0]
    loss = planned(model.batch)
    loss.backward()
    want = raw.loss_fn(raw.module(**raw.batch))
    want.backward()
    torch.testing.assert_close(loss, want)
    for (name, a), b in zip(model.module.model.named_parameters(), raw.module.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    for (name, a), b in zip(model.module.model.named_buffers(), raw.module.buffers()):
        torch.testing.assert_close(a, b, msg=name)
    # the fused forward's outputs and saved tensors are one op, made (and remade) by each compute: predicted so
    stages, (traced, flat) = planned.step.stages, trace_training_step(model)
    layout = GraphLayout.build(traced.gm, [t.detach() for t in flat], graph_tables(traced).tensors)
    run = run_plan(stage_layouts(stages, layout), [st.events for st in stages], layout, traced.gm,
                   device=torch.device("cpu"), measure=True)
    assert [r.bytes_after for r in run.records] == predict(stages[0].problem, stages[0].events).bytes_after
    forward = {op["id"] for op in stages[0].raw["ops"] if op["id"].endswith("_fwd")}
    assert forward and not any(op.get("of") in forward for op in stages[0].raw["ops"])
    (copy_op,) = [op for op in stages[0].raw["ops"] if copies[0].name in op["nodes"]]
    assert len(copy_op["inputs"]) == 1 and copy_op["inputs"][0] in forward  # the four statistics: the op's own


class _BatchNormChain(torch.nn.Module):
    """Four conv-BN-ReLU blocks and a linear head: each block fused on its own, so that a plan can drop a block's
    saved tensors after its forward and remake them (its statistics with them) for its backward."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Conv2d(c, 8, 3, padding=1),
                                                                torch.nn.BatchNorm2d(8), torch.nn.ReLU())
                                            for c in (3, 8, 8, 8)))
        self.head = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.head(self.blocks(x).mean(dim=(2, 3))), labels)


def _bn_chain() -> BuiltModel:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    batch = {"x": torch.randn(4, 3, 32, 32, generator=gen), "labels": torch.randint(0, 10, (4,), generator=gen)}
    return BuiltModel("bn_chain", _BatchNormChain(), batch, lambda loss: loss)


def test_a_plan_recomputes_a_batch_norm_group_whole_and_keeps_eagers_gradients_and_statistics(tmp_path):
    """A fused forward op and the tensors its backward saves are one op of the problem: recomputed, the op remakes
    them all. The recomputed batch-norm blocks read their running statistics after the step's copy has updated
    them; in training mode only the new statistics depend on them, and those the copy took at the first compute."""
    built, eager = _bn_chain(), _bn_chain()
    _, _, groups = forward_groups(trace_forward(built), inductor_table(), max_ops=4)  # the chain cut at each block
    blocks = [g["nodes"] for g in groups if g["nodes"][0].startswith("convolution")]
    assert [[n.rstrip("_0123456789") for n in b] for b in blocks] == [["convolution", "native_batch_norm", "getitem",
                                                                       "relu"]] * 4
    model = fuse_model(built, groups, compile_with_inductor=False)
    assert model.built.module.fusion["groups_fused"] == 5  # and the head's linear and loss
    planned = trainplan.plan(model.built.module, built.batch, 0.5, time_limit_s=3, progress=False, cache_dir=tmp_path,
                             on_infeasible="raise_budget")
    report, stage = planned.report, planned.step.stages[0]
    assert report.planned_budget_bytes < 0.8 * report.no_recompute_peak_bytes  # below what no recompute holds
    computes = Counter(o for kind, o in stage.events if kind == "compute")
    recomputed = [o for o, c in computes.items() if c > 1 and o.endswith("_fwd")]
    assert recomputed
    ops = {op["id"]: op for op in stage.raw["ops"]}
    assert all(len(ops[o]["storages"]) > 1 for o in recomputed)  # its saved tensors with it
    loss = planned(built.batch)
    loss.backward()
    want = eager.module(**eager.batch)
    want.backward()
    torch.testing.assert_close(loss, want)
    for (name, a), b in zip(built.module.named_parameters(), eager.module.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    for (name, a), b in zip(built.module.named_buffers(), eager.module.buffers()):
        torch.testing.assert_close(a, b, msg=name)
    traced, flat = trace_training_step(model.built)
    layout = GraphLayout.build(traced.gm, [t.detach() for t in flat], graph_tables(traced).tensors)
    run = run_plan(stage_layouts([stage], layout), [stage.events], layout, traced.gm, device=torch.device("cpu"),
                   measure=True)
    predicted = predict(stage.problem, stage.events)
    assert [r.bytes_after for r in run.records] == predicted.bytes_after
    assert max(predicted.bytes_after) <= report.planned_budget_bytes


def test_a_group_drawing_random_numbers_is_never_recomputed():
    """A group holding a dropout: its forward op is named ``..._random_fwd`` and its problem op may not be
    recomputed (a recompute would draw another mask)."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                 torch.nn.Linear(32, 1))
    built = BuiltModel("dropout_mlp", module, {"input": torch.randn(8, 16)}, lambda out: out.square().mean())
    groups, _ = partition_forward(trace_forward(built), inductor_table())
    model = fuse_model(built, groups, compile_with_inductor=False)
    traced, _ = trace_training_step(model.built)
    tables = graph_tables(traced)
    problem = stage_problem(tables.nodes.assign(time_s=1e-3), tables.tensors, tables.nodes.name.tolist(),
                            bandwidth=1e10)
    fused = {op["id"]: op["recompute"] for op in problem["ops"] if op["id"].endswith("_fwd")}
    assert any(o.endswith("_random_fwd") for o in fused) and not any(fused[o] for o in fused if "_random" in o)
    assert len(fused) > 1 and all(fused[o] for o in fused if "_random" not in o)


def test_the_check_against_the_unfused_model_passes_and_fails_a_fused_kernel_computing_otherwise(monkeypatch):
    """gradients_vs_unfused (the export's check of a fused model): the fused tiny GPT-2 passes in float32, and its
    groups fused in float64 give the float64 step's gradients to round-off; with every fused half's outputs 0.1%
    off (a kernel computing otherwise), the float32 check fails, the float64 one runs and fails too."""
    spec = fused_spec("tiny_gpt2", TINY, {"builtin": "inductor"}, seed=0, compiler="fx")
    check = gradients_vs_unfused(build_model("tiny_gpt2+inductor", spec, seed=0), spec, rtol=1e-4, atol=1e-5)
    assert check["passed"] and check["fused"]["within_tolerance"] and "float64" not in check
    assert check["fused"]["loss"] == pytest.approx(check["fused"]["exact_loss"], rel=1e-5)
    assert float64_check(spec)["max_rel_err"] < 1e-12
    runner = fused_ops._runner

    def off(gm, example, compile_with_inductor):
        run = runner(gm, example, compile_with_inductor)
        return lambda inputs: [t * 1.001 if t.is_floating_point() else t for t in run(inputs)]

    digest = fused_ops._digest
    monkeypatch.setattr(fused_ops, "_runner", off)
    monkeypatch.setattr(fused_ops, "_digest", lambda *args: f"{digest(*args)}off")  # ops of their own names
    check = gradients_vs_unfused(build_model("tiny_gpt2+inductor", spec, seed=0), spec, rtol=1e-4, atol=1e-5)
    assert not check["fused"]["within_tolerance"] and check["fused"]["worst_ratio"] > 1.0
    assert not check["passed"] and check["float64"]["max_rel_err"] > 1e-4
