"""Fused groups as operators of the training step (issue #52, item 2): each group of the forward graph becomes
two ``torch.library`` custom ops, its forward and its backward, split by AOT autograd's min-cut partitioner
(which decides what the backward saves). The forward op returns the group's outputs and the tensors its backward
saves; an autograd Function calls the two, so tracing the training step of the fused model shows one forward
node and one backward node per group, with the saved tensors as the forward node's outputs.

Views are kept out of the ops (a custom op may not return an alias of its input): an output or saved tensor that
is a view of an input or of a computed tensor is rebuilt outside the op by replaying its view ops on the base.
Likewise an input the group writes in place (batch norm's running statistics): the forward op returns its new
value (AOT autograd's functional graph does) and the call copies the new values into their inputs outside the op,
all in one ``_foreach_copy_`` (one node of the step reading them all, so the planning graph holds them with the
forward op rather than as one op and one copy per statistic: ResNet-50 has 106). Outside the op, a recompute of the
forward op does not write the statistics again; a rerun of the copy writes the same values.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from functorch.compile import aot_function, make_boxed_func, min_cut_rematerialization_partition
from torch._prims_common import is_non_overlapping_and_dense_or_false

from trainplan.aten_ops import RANDOM_OPS
from trainplan import direct_kernels
from trainplan.export.trace import flat_inputs
from trainplan.export.traced_step import is_view_node
from trainplan.fuse.errors import FuseError
from trainplan.fuse.forward import trace_forward
from trainplan.fuse.inductor import CallArgs, error_line, tensors_of
from trainplan.models import BuiltModel, default_loss

#: namespace of the fused ops (``torch.ops.trainplan_fused.<name>_fwd``)
NAMESPACE = "trainplan_fused"
_REGISTERED: dict[str, Any] = {}  # op name -> op: a group's ops are registered once per process


@dataclass(frozen=True)
class Recipe:
    """A tensor rebuilt outside the ops: ``source`` ("input", i) or ("root", j) of the forward op's outputs,
    then the view ops ``chain`` (target, args after the base, kwargs) replayed on it."""

    source: tuple[str, int]
    chain: tuple[tuple[Any, tuple[Any, ...], dict[str, Any]], ...] = ()

    def build(self, inputs: Sequence[torch.Tensor], roots: Sequence[torch.Tensor]) -> torch.Tensor:
        value = inputs[self.source[1]] if self.source[0] == "input" else roots[self.source[1]]
        for target, args, kwargs in self.chain:
            value = target(value, *args, **kwargs)
        return value


def _recipe(node: torch.fx.Node, placeholders: list[torch.fx.Node], roots: list[torch.fx.Node]) -> Recipe:
    chain = []
    while is_view_node(node):
        if any(isinstance(a, torch.fx.Node) for a in [*node.args[1:], *node.kwargs.values()]):
            break  # a view whose arguments are tensors: computed in the op
        chain.append((node.target, tuple(node.args[1:]), dict(node.kwargs)))
        node = node.args[0]
    if node.op == "placeholder":
        return Recipe(("input", placeholders.index(node)), tuple(reversed(chain)))
    if node not in roots:
        roots.append(node)
    return Recipe(("root", roots.index(node)), tuple(reversed(chain)))


@dataclass
class _Split:
    forward: torch.fx.GraphModule  # inputs -> roots
    backward: torch.fx.GraphModule | None  # saved + tangents -> grads (None where an input needs none); None: no grads
    outputs: list[Recipe]
    saved: list[Recipe]
    tangent_of: list[int]  # outputs the backward takes a gradient of (those requiring grad), in its input order
    updates: list[tuple[int, Recipe]] = field(default_factory=list)  # (input written in place, its new value)


def _split(sub: torch.fx.GraphModule, args: Sequence[Any]) -> tuple[_Split, list[torch.Tensor]]:
    """AOT autograd's forward and backward graphs of ``sub`` (min-cut partition), the forward rewritten to return
    only the computed tensors that outputs and saved values are views of; and one real run's backward inputs."""
    captured: dict[str, torch.fx.GraphModule] = {}
    bw_args: list[torch.Tensor] = []

    def fw_compiler(gm: torch.fx.GraphModule, _example: Any) -> Callable[..., Any]:
        captured["fw"] = gm
        return make_boxed_func(gm)

    def bw_compiler(gm: torch.fx.GraphModule, _example: Any) -> Callable[..., Any]:
        captured["bw"] = gm
        boxed = make_boxed_func(gm)

        def run(flat: list[Any]) -> Any:
            bw_args.extend(flat)
            return boxed(flat)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    fn = aot_function(sub, fw_compiler, bw_compiler, partition_fn=min_cut_rematerialization_partition)
    leaves = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
    versions = [a._version if isinstance(a, torch.Tensor) else None for a in leaves]
    results = tensors_of(fn(*leaves))
    # inputs the group writes in place (batch norm's running statistics): AOT autograd copies their new values in
    written = [i for i, (a, v) in enumerate(zip(leaves, versions)) if v is not None and a._version != v]
    tangent_of = [i for i, t in enumerate(results) if t.requires_grad]
    if not tangent_of:
        if written:
            raise FuseError("the group writes an input in place and none of its outputs needs a gradient: left as its ops")
        return _forward_only(sub), []
    torch.autograd.backward([results[i] for i in tangent_of], [torch.ones_like(results[i]) for i in tangent_of])
    if "bw" not in captured:
        raise FuseError("the group's outputs are views of its inputs: no kernel to fuse, left as its ops")
    fw, bw = captured["fw"], captured["bw"]
    placeholders = [n for n in fw.graph.nodes if n.op == "placeholder"]
    bw_inputs = [n for n in bw.graph.nodes if n.op == "placeholder"]
    n_tangents = sum(n.name.startswith("tangents") for n in bw_inputs)
    if n_tangents != len(tangent_of):
        raise FuseError(f"the group's backward takes {n_tangents} gradients for {len(tangent_of)} outputs requiring grad")
    returned = list(next(n for n in fw.graph.nodes if n.op == "output").args[0])
    n_saved = len(bw_inputs) - n_tangents
    if any(not isinstance(n, torch.fx.Node) for n in returned):
        raise FuseError("the group's forward returns a non-tensor")
    # AOT autograd's forward returns the new values of the inputs it writes, the outputs, then the saved tensors
    if len(returned) - n_saved - len(results) != len(written):
        raise FuseError(f"the group's forward returns {len(returned) - n_saved} tensors for {len(results)} outputs and "
                        f"{len(written)} inputs written in place")
    roots: list[torch.fx.Node] = []  # the op's first result is an output's (the new values, copied in, come last)
    outputs = [_recipe(n, placeholders, roots) for n in returned[len(written): len(returned) - n_saved]]
    saved = [_recipe(n, placeholders, roots) for n in returned[len(returned) - n_saved:]]
    updates = [(i, _recipe(n, placeholders, roots)) for i, n in zip(written, returned)]
    out = next(n for n in fw.graph.nodes if n.op == "output")
    out.args = (tuple(roots),)
    fw.graph.eliminate_dead_code()
    fw.recompile()
    return _Split(fw, bw, outputs, saved, tangent_of, updates), list(bw_args)


def _forward_only(sub: torch.fx.GraphModule) -> _Split:
    """A group none of whose outputs needs a gradient (masks, position ids): its graph is the forward op."""
    fw = torch.fx.GraphModule(sub, copy.deepcopy(sub.graph))
    placeholders = [n for n in fw.graph.nodes if n.op == "placeholder"]
    out = next(n for n in fw.graph.nodes if n.op == "output")
    returned = list(out.args[0]) if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    roots: list[torch.fx.Node] = []
    outputs = [_recipe(n, placeholders, roots) for n in returned]
    out.args = (tuple(roots),)
    fw.graph.eliminate_dead_code()
    fw.recompile()
    return _Split(fw, None, outputs, [], [])


def _fresh(outs: Sequence[torch.Tensor | None], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Outputs with none aliasing an input or an earlier output (a custom op returns fresh tensors)."""
    seen = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.numel()}
    fresh = []
    for t in outs:
        assert t is not None
        ptr = t.untyped_storage().data_ptr()
        if t.numel() and ptr in seen:
            t = t.clone()
            ptr = t.untyped_storage().data_ptr()
        seen.add(ptr)
        fresh.append(t)
    return fresh


Meta = tuple[tuple[int, ...], tuple[int, ...], torch.dtype, torch.device]


def _meta(ts: Sequence[torch.Tensor]) -> list[Meta]:
    return [(tuple(t.shape), tuple(t.stride()), t.dtype, t.device) for t in ts]


def _register(name: str, run: Callable[[list[torch.Tensor]], list[torch.Tensor]], meta: list[Meta]) -> Any:
    """A custom op ``trainplan_fused::name(Tensor[] inputs) -> Tensor[]`` running ``run``, whose fake
    implementation returns empty tensors of the recorded shapes, strides and dtypes (static shapes)."""
    if name in _REGISTERED:
        return _REGISTERED[name]

    def impl(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return _fresh(run(inputs), inputs)

    op = torch.library.custom_op(f"{NAMESPACE}::{name}", impl, mutates_args=(),
                                 schema="(Tensor[] inputs) -> Tensor[]")

    def fake(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.empty_strided(shape, stride, dtype=dtype, device=device) for shape, stride, dtype, device in meta]

    op.register_fake(fake)
    direct_kernels.register(getattr(getattr(torch.ops, NAMESPACE), name).default, impl)
    _REGISTERED[name] = op
    return op


@dataclass
class GroupOps:
    """The forward and backward ops of one group and how to rebuild its outputs and saved tensors."""

    name: str
    forward: Any
    backward: Any  # None for a group none of whose outputs needs a gradient
    split: _Split
    output_meta: list[Meta]
    grad_of: list[int]  # inputs whose gradient the backward op returns, in its output order

    def __call__(self, *inputs: torch.Tensor) -> Any:
        results = _FusedGroup.apply(self, *inputs)
        results = list(results) if isinstance(results, tuple) else [results]
        n_out = len(self.split.outputs)
        if self.split.updates:  # inputs the group writes in place (batch norm's running statistics)
            with torch.no_grad():
                torch._foreach_copy_([inputs[i] for i, _ in self.split.updates], results[n_out:])
        return tuple(results[:n_out]) if n_out > 1 else results[0]


class _FusedGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, ops: GroupOps, *inputs: torch.Tensor) -> Any:  # type: ignore[override]
        roots = ops.forward(list(inputs))
        ctx.ops, ctx.saved = ops, [r.build(inputs, roots) for r in ops.split.saved]
        outs = [r.build(inputs, roots) for r in ops.split.outputs]
        updates = [r.build(inputs, roots) for _, r in ops.split.updates]
        ctx.mark_non_differentiable(*updates)
        if ops.backward is None:  # no output needs a gradient (a dropout's mask), though an input may
            ctx.mark_non_differentiable(*outs)
        ctx.set_materialize_grads(False)  # else autograd makes a zeros gradient for every new running statistic
        outs += updates
        return tuple(outs) if len(outs) > 1 else outs[0]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        ops: GroupOps = ctx.ops
        saved, ctx.saved = ctx.saved, None
        tangents = []
        for i in ops.split.tangent_of:
            shape, _, dtype, device = ops.output_meta[i]
            tangents.append(grads[i] if grads[i] is not None else torch.zeros(shape, dtype=dtype, device=device))
        computed = ops.backward([*saved, *tangents])
        result: list[torch.Tensor | None] = [None] * (len(ctx.needs_input_grad) - 1)
        for i, g in zip(ops.grad_of, computed):
            result[i] = g
        return (None, *result)


class InductorFailed(FuseError):
    """Inductor could not compile a half of a group (the group can still run as its fx graphs)."""


def _runner(gm: torch.fx.GraphModule, example: list[torch.Tensor], compile_with_inductor: bool
            ) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """``gm`` as a function of a list of tensors. Inductor's code asserts its inputs' strides, and an executor
    may hand a view's values in another layout than the traced one: it is compiled for the traced layouts (a dense
    one each: an overlapping or gapped input, such as an expanded one, is compiled as contiguous) and an input in
    another layout is copied into its compiled one (compiled for contiguous inputs, every call copied the
    transposed weights a linear layer reads).

    Compiled for inference: a backward half's example holds the parameters, which require grad, and from those
    Inductor would compile a training graph (a forward and a backward of the half itself), saving tensors for a
    second backward that never runs (ResNet-50's stem: a bool mask of the whole stem activation, stored element
    by element). Without ``layout_optimization``: a group's inputs and outputs keep the model's layout, so
    channels-last convolutions inside it transpose at every boundary (ResNet-50's groups: a copy in and two
    stores out per convolution)."""
    if not compile_with_inductor:
        return lambda inputs: list(gm(*inputs))
    dense = [t.detach() if is_non_overlapping_and_dense_or_false(t) else t.detach().contiguous() for t in example]
    layouts = [(tuple(t.shape), tuple(t.stride())) for t in dense]
    try:
        with torch._inductor.config.patch(layout_optimization=False):
            compiled = torch._inductor.compile(gm, dense)
    except Exception as exc:  # the caller runs the group as its fx graphs instead
        raise InductorFailed(error_line(exc)) from exc

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(compiled(*(t if tuple(t.stride()) == stride else
                               torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device).copy_(t)
                               for t, (shape, stride) in zip(inputs, layouts))))

    return run


def _digest(sub: torch.fx.GraphModule, args: Sequence[Any], compile_with_inductor: bool) -> str:
    text = sub.code + repr([(tuple(a.shape), a.dtype, a.requires_grad) for a in args if isinstance(a, torch.Tensor)])
    return hashlib.sha256(f"{text}{compile_with_inductor}".encode()).hexdigest()[:16]


def group_ops(sub: torch.fx.GraphModule, args: Sequence[torch.Tensor], *, compile_with_inductor: bool = True) -> GroupOps:
    """The fused forward and backward ops of the group ``sub`` (an fx graph of aten ops), on the inputs ``args``
    it gets in a real step (those requiring grad as there): split by AOT autograd, each half compiled by
    Inductor (``compile_with_inductor``) or run as its fx graph."""
    split, bw_args = _split(sub, args)
    inputs = [a.detach() for a in args]
    roots = list(split.forward(*inputs))
    if not roots:
        raise FuseError("the group computes nothing of its own (views of its inputs only): left as its ops")
    outputs = [r.build(inputs, roots) for r in split.outputs]
    random = any(str(n.target).startswith(RANDOM_OPS) for n in sub.graph.nodes if n.op == "call_function")
    # a plan recomputes a fused forward op whole (trainplan.schedule.stage_problem), unless it draws random numbers
    name = f"group_{_digest(sub, args, compile_with_inductor)}{'_random' if random else ''}"
    forward = _register(f"{name}_fwd", _runner(split.forward, inputs, compile_with_inductor), _meta(roots))
    if split.backward is None:
        return GroupOps(name, forward, None, split, _meta(outputs), [])
    bw_out = next(n for n in split.backward.graph.nodes if n.op == "output")
    grad_of = [i for i, g in enumerate(bw_out.args[0]) if isinstance(g, torch.fx.Node)]
    bw_out.args = (tuple(bw_out.args[0][i] for i in grad_of),)
    split.backward.recompile()
    grads = list(split.backward(*bw_args))
    backward = _register(f"{name}_bwd", _runner(split.backward, list(bw_args), compile_with_inductor), _meta(grads))
    return GroupOps(name, forward, backward, split, _meta(outputs), grad_of)


class _GroupCall(torch.nn.Module):
    """A fused group in the forward graph's place of its fx submodule."""

    def __init__(self, ops: GroupOps) -> None:
        super().__init__()
        self.ops = ops

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.ops(*inputs)


class FusedModule(torch.nn.Module):
    """The model's forward pass with fused groups: ``fused(**batch)`` returns the loss. Its parameters and
    buffers are the model's own (``fused.model``), read at every call, so ``functional_call`` (the tracer) and
    optimizers see them as on the model."""

    def __init__(self, model: torch.nn.Module, gm: torch.fx.GraphModule, batch_names: list[str]) -> None:
        super().__init__()
        self.model, self.gm, self.batch_names = model, gm, batch_names
        self.fusion: dict[str, Any] = {}  # set by fuse_model: which groups run fused, how, and which do not

    def forward(self, **batch: torch.Tensor) -> torch.Tensor:
        flat = [*dict(self.model.named_parameters()).values(), *dict(self.model.named_buffers()).values(),
                *(batch[n] for n in self.batch_names)]
        loss = self.gm(*flat)
        return loss[0] if isinstance(loss, (list, tuple)) else loss


@dataclass
class FusedModel:
    """A model whose forward groups run as fused ops: the BuiltModel to trace and train, and per group its op name,
    op count and how it runs (``inductor``, or ``fx`` with the Inductor error), or why it was left unfused."""

    built: BuiltModel
    fused: list[dict[str, Any]]
    unfused: list[dict[str, Any]]


def _group_ops(sub: torch.fx.GraphModule, args: Sequence[torch.Tensor], compile_with_inductor: bool
               ) -> tuple[GroupOps, dict[str, Any]]:
    """group_ops, falling back to the fx graphs where Inductor fails on the group; how it runs."""
    if compile_with_inductor:
        try:
            return group_ops(sub, args, compile_with_inductor=True), {"runs": "inductor"}
        except InductorFailed as exc:
            return group_ops(sub, args, compile_with_inductor=False), {"runs": "fx", "inductor_error": str(exc)}
    return group_ops(sub, args, compile_with_inductor=False), {"runs": "fx"}


def fuse_model(built: BuiltModel, groups: list[dict[str, Any]], *, min_ops: int = 2,
               compile_with_inductor: bool = True) -> FusedModel:
    """``built`` with every forward group (``forward_groups``' entries) of at least ``min_ops`` ops made one
    fused op pair (:func:`group_ops`); a group Inductor fails to compile runs as its fx graphs, one AOT autograd
    cannot take (views of its inputs only) stays as its ops, each recorded. The module's ``fusion`` attribute
    holds the record. The real runs the build makes leave the model's buffers (running statistics) as they were."""
    from trainplan.fuse.train_step import _flatten_output, _fuse

    buffers = [(b, b.clone()) for b in built.module.buffers()]
    fg = trace_forward(built)
    chosen = [g for g in groups if len(g["nodes"]) >= min_ops]
    gm = _fuse(fg, [g["nodes"] for g in chosen])
    recorder = CallArgs(gm)
    recorder.run(*fg.inputs)
    fused, unfused = [], []
    for k, group in enumerate(chosen):
        sub, args = getattr(gm, f"fused_{k}"), recorder.args[f"fused_{k}"]
        _flatten_output(sub)
        try:
            ops, how = _group_ops(sub, args, compile_with_inductor)
        except Exception as exc:  # the group stays as its ops; reported with the reason
            unfused.append({"group": group["id"], "n_ops": len(group["nodes"]), "error": error_line(exc)})
            continue
        setattr(gm, f"fused_{k}", _GroupCall(ops))
        split = {"split_from": group["split_from"]} if "split_from" in group else {}  # trainplan.fuse.split
        fused.append({"group": group["id"], **split, "n_ops": len(group["nodes"]), "op": ops.name, **how})
    with torch.no_grad():
        for buffer, before in buffers:
            buffer.copy_(before)
    gm.recompile()
    _, _, batch_names, _ = flat_inputs(built)
    module = FusedModule(built.module, gm, batch_names)
    module.fusion = {"groups_fused": len(fused), "ops_fused": sum(f["n_ops"] for f in fused),
                     "groups_fx": sum(f["runs"] == "fx" for f in fused), "groups_unfused": len(unfused),
                     "groups_split": len({f["split_from"] for f in fused if "split_from" in f}),
                     "fused": fused, "unfused": unfused}
    return FusedModel(BuiltModel(f"{built.name}+fused", module, built.batch, default_loss), fused, unfused)
