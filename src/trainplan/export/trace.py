"""Trace one training step (forward, loss, backward) of a model into a static aten-level fx graph."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode

from trainplan.export.embedding_grads import fold_embedding_gradient_sums
from trainplan.export.loss_head import chunk_loss_head
from trainplan.export.traced_step import TracedStep
from trainplan.models import BuiltModel


class TraceError(RuntimeError):
    """A model's training step cannot be traced; the message names the model and the op."""


#: Attribute reads and metadata queries: not the op a user would look for when tracing fails.
_NOT_OPS = ("__get__", ".stride", ".size", ".dim", ".numel", ".storage_offset", ".is_contiguous", ".element_size")


class _LastCall(TorchFunctionMode):
    """Remember the last torch function called, to name the op where tracing failed."""

    def __init__(self) -> None:
        super().__init__()
        self.last = "<none>"

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
        if not name.endswith(_NOT_OPS) and not name.startswith("sym_"):
            self.last = name
        return func(*args, **(kwargs or {}))


@contextmanager
def _record_module_paths(root: torch.nn.Module) -> Iterator[None]:
    """Tag every traced forward op with the dotted path of the innermost module running it."""
    stack: list[str] = []

    def _set() -> None:
        fx_traceback.current_meta["nn_module_stack"] = {p: (p, "") for p in stack}

    def pre(name: str) -> Any:
        return lambda _m, _a: (stack.append(name), _set())[-1]

    def post(_name: str) -> Any:
        return lambda _m, _a, _o: (stack.pop(), _set())[-1]

    handles = []
    for name, mod in root.named_modules():
        handles.append(mod.register_forward_pre_hook(pre(name)))
        handles.append(mod.register_forward_hook(post(name)))
    try:
        with fx_traceback.preserve_node_meta():
            yield
    finally:
        for h in handles:
            h.remove()


def module_path(node: torch.fx.Node) -> str:
    """Innermost module path recorded on a traced node ('' when none was)."""
    stack = node.meta.get("nn_module_stack") or {}
    return list(stack)[-1] if stack else ""


#: key of fx meta ``custom`` holding the autograd sequence number of the backward function running an op
GRAD_FN_KEY = "grad_fn_seq_nr"


def _enter_grad_fn(seq: int) -> None:
    fx_traceback.set_grad_fn_seq_nr(seq)
    fx_traceback.current_meta["custom"] = {**fx_traceback.current_meta.get("custom", {}), GRAD_FN_KEY: seq}


def _exit_grad_fn() -> None:
    fx_traceback.reset_grad_fn_seq_nr()
    outer = fx_traceback.current_meta.get("grad_fn_seq_nr")
    custom = {k: v for k, v in fx_traceback.current_meta.get("custom", {}).items() if k != GRAD_FN_KEY}
    if outer:
        custom[GRAD_FN_KEY] = outer[-1]
    fx_traceback.current_meta["custom"] = custom


def link_backward_to_forward(loss: torch.Tensor) -> None:
    """While tracing, tag every op that a backward function of ``loss``'s autograd graph runs with that
    function's sequence number: fx meta ``seq_nr`` (torch's own forward/backward link, as aot_autograd sets
    it) and ``custom[GRAD_FN_KEY]`` (set only inside a backward function, so an op the engine runs between
    functions, such as a gradient accumulation, is told apart). The forward op that created the function
    carries the same ``seq_nr``, so a backward op can be attributed to the module of the op it differentiates."""
    seen: set[torch.autograd.graph.Node] = set()
    queue = [loss.grad_fn] if loss.grad_fn is not None else []
    while queue:
        fn = queue.pop()
        if fn in seen:
            continue
        seen.add(fn)
        seq = fn._sequence_nr()
        fn.register_prehook(lambda _g, seq=seq: _enter_grad_fn(seq))
        fn.register_hook(lambda _gi, _go: _exit_grad_fn())
        queue.extend(f for f, _ in fn.next_functions if f is not None and f not in seen)


def backward_seq_nr(node: torch.fx.Node) -> int | None:
    """Sequence number of the backward function that ran a traced backward op (None outside any)."""
    seq = (node.meta.get("custom") or {}).get(GRAD_FN_KEY)
    return seq if isinstance(seq, int) else None


def flat_inputs(built: BuiltModel) -> tuple[list[str], list[str], list[str], list[torch.Tensor]]:
    """Names of parameters, buffers and batch entries, and the flat list of their tensors."""
    params = dict(built.module.named_parameters())
    buffers = dict(built.module.named_buffers())
    batch = {k: v for k, v in built.batch.items() if isinstance(v, torch.Tensor)}
    flat = list(params.values()) + list(buffers.values()) + list(batch.values())
    return list(params), list(buffers), list(batch), flat


def make_step_fn(built: BuiltModel, param_names: list[str], buffer_names: list[str], batch_names: list[str],
                 on_loss: Callable[[torch.Tensor], None] | None = None) -> Any:
    """The training step as a function of flat tensors: returns ``(loss, *grads)``. ``on_loss`` is called
    with the loss before the backward pass."""
    n_p, n_b = len(param_names), len(buffer_names)

    def step(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        params = dict(zip(param_names, flat[:n_p]))
        buffers = dict(zip(buffer_names, flat[n_p : n_p + n_b]))
        batch = dict(zip(batch_names, flat[n_p + n_b :]))
        out = torch.func.functional_call(built.module, {**params, **buffers}, args=(), kwargs=batch, tie_weights=True)
        loss = built.loss_fn(out)
        if on_loss is not None:
            on_loss(loss)
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        grads = tuple(torch.zeros_like(p) if g is None else g for p, g in zip(params.values(), grads))
        return (loss, *grads)

    return step


def trace_training_step(built: BuiltModel, *, sums_in_place: bool = True) -> tuple[TracedStep, list[torch.Tensor]]:
    """Trace ``built``'s training step with fake tensors; return the graph and the real flat inputs. With
    ``built.loss_chunk_bytes``, the graph's loss head is chunked (``export.loss_head.chunk_loss_head``); a tied
    embedding's gradient is added row by row into the weight's other gradient
    (``export.embedding_grads.fold_embedding_gradient_sums``), in place where ``sums_in_place`` (a pipeline's
    step: not, ``export.functional_sums``)."""
    param_names, buffer_names, batch_names, flat = flat_inputs(built)
    for p in built.module.parameters():
        p.requires_grad_(True)
    step = make_step_fn(built, param_names, buffer_names, batch_names, on_loss=link_backward_to_forward)
    watcher = _LastCall()
    try:
        with watcher, _record_module_paths(built.module):
            gm = make_fx(step, tracing_mode="fake", record_module_stack=True)(*flat)
    except Exception as exc:  # any failure inside tracing is reported with the model and op
        raise TraceError(f"model '{built.name}': tracing failed at op '{watcher.last}': {type(exc).__name__}: {exc}") from exc
    output = next(n for n in gm.graph.nodes if n.op == "output")
    loss_node = output.args[0][0]
    if not isinstance(loss_node, torch.fx.Node):
        raise TraceError(f"model '{built.name}': the loss is not computed from the inputs (constant loss)")
    traced = TracedStep(built.name, gm, param_names, buffer_names, batch_names, loss_node.name)
    if built.loss_chunk_bytes is not None:
        traced = chunk_loss_head(traced, built.loss_chunk_bytes)
    return fold_embedding_gradient_sums(traced, sums_in_place), flat
