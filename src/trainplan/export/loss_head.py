"""A pass on a traced training step: its language-model loss head (the logits' matmul, log-softmax and NLL loss,
and their backward) replaced by one ``trainplan::linear_cross_entropy`` op computed in row chunks
(:mod:`trainplan.export.loss_head_op`).

The pattern is the one PyTorch traces for ``cross_entropy(hidden @ weight.T, target)`` with the loss as the
step's output (Hugging Face's causal-LM loss on fp32 logits, tied or untied head)::

    mm(h, t(W)) -> views -> _log_softmax -> nll_loss_forward -> loss
    ones_like(loss) -> nll_loss_backward -> _log_softmax_backward_data -> views -> mm(t(g), h) : d W
                                                                              -> mm(g, t(t(W))) : d h

It becomes ``linear_cross_entropy(h, W, target)`` whose outputs replace the loss and the two gradient matmuls;
nothing else of the step changes. A step without that pattern (another loss, logits read elsewhere, a bias on
the head, logits cast before the loss) raises :class:`LossHeadError` naming what differs.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import torch
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from trainplan.export.loss_head_op import MEAN, SUM, linear_cross_entropy
from trainplan.export.traced_step import TracedStep

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_TRANSPOSES = (aten.t.default,)
_DETACH = aten.detach.default


class LossHeadError(ValueError):
    """The step's loss head is not the linear + cross-entropy pattern; the message names the model and node."""


def _shape(node: torch.fx.Node) -> tuple[int, ...]:
    val = node.meta.get("val")
    return tuple(val.shape) if isinstance(val, torch.Tensor) else ()


def _closure(start: torch.fx.Node, targets: Iterable[object]) -> set[torch.fx.Node]:
    """``start`` and every node reached from it through users whose target is one of ``targets``."""
    kinds, seen, todo = tuple(targets), {start}, [start]
    while todo:
        for user in todo.pop().users:
            if user.target in kinds and user not in seen:
                seen.add(user)
                todo.append(user)
    return seen


def _base(node: torch.fx.Node) -> torch.fx.Node:
    """The node a chain of views and transposes starts from."""
    while node.target in _VIEWS + _TRANSPOSES:
        node = node.args[0]  # type: ignore[assignment]
    return node


def _one(nodes: list[torch.fx.Node], what: str, where: str) -> torch.fx.Node:
    if len(nodes) != 1:
        raise LossHeadError(f"{where}: expected one {what}, found {len(nodes)}")
    return nodes[0]


def chunk_loss_head(traced: TracedStep, chunk_bytes: int) -> TracedStep:
    """``traced`` with its loss head as one ``linear_cross_entropy`` op whose logits chunks hold at most
    ``chunk_bytes`` (at least one row)."""
    where = f"model '{traced.model}'"
    graph = traced.gm.graph
    nll = _one([n for n in graph.nodes if n.target is aten.nll_loss_forward.default], "nll_loss_forward", where)
    log_sm, target, weight_arg, reduction, ignore_index = nll.args
    if weight_arg is not None or reduction not in (MEAN, SUM):
        raise LossHeadError(f"{where}: '{nll.name}' has class weights or reduction {reduction} (mean or sum only)")
    if log_sm.target is not aten._log_softmax.default or log_sm.args[1] not in (1, -1) or log_sm.args[2]:
        raise LossHeadError(f"{where}: the loss reads '{log_sm}', not a log-softmax over the vocabulary")
    logits_chain = [log_sm.args[0]]
    while logits_chain[-1].target in _VIEWS:
        logits_chain.append(logits_chain[-1].args[0])
    matmul = logits_chain[-1]
    if matmul.target is not aten.mm.default or matmul.args[1].target not in _TRANSPOSES:
        raise LossHeadError(f"{where}: the logits '{logits_chain[0]}' are not a matmul with a transposed weight "
                            f"(found '{matmul.target}'; a head with a bias or a cast before the loss is not chunked)")
    hidden, weight = matmul.args[0], matmul.args[1].args[0]
    rows, vocab = _shape(logits_chain[0])
    if _shape(hidden)[:1] != (rows,) or _shape(weight)[:1] != (vocab,):
        raise LossHeadError(f"{where}: the logits {rows} x {vocab} do not match '{hidden}' and '{weight}'")
    loss = _one([u for u in nll.users if u.args[1] == 0], "loss output of nll_loss_forward", where)
    if loss.name != traced.loss_node:
        raise LossHeadError(f"{where}: '{loss}' is not the step's loss ('{traced.loss_node}')")

    saved = _closure(log_sm, [_DETACH])
    backward = _one([u for s in saved for u in s.users if u.target is aten.nll_loss_backward.default],
                    "nll_loss_backward", where)
    seed = backward.args[0]
    if seed.target is not aten.ones_like.default or seed.args[0] is not loss:
        raise LossHeadError(f"{where}: the loss's backward starts from '{seed}', not its own gradient of 1")
    softmax_bw = _one([u for s in saved for u in s.users if u.target is aten._log_softmax_backward_data.default],
                      "_log_softmax_backward_data", where)
    grad_views = _closure(softmax_bw, _VIEWS + _TRANSPOSES)
    replaced: dict[torch.fx.Node, int] = {loss: 0}  # old node -> output of the new op standing for it
    for user in {u for g in grad_views for u in g.users} - grad_views:
        a, b = user.args if user.target is aten.mm.default else (None, None)
        if a in grad_views and b is hidden and _shape(user) == (vocab, _shape(hidden)[1]):
            replaced[user] = 2
        elif a in grad_views and isinstance(b, torch.fx.Node) and _base(b) is weight and _shape(user) == _shape(hidden):
            replaced[user] = 1
        else:
            raise LossHeadError(f"{where}: the logits' gradient is read by '{user}' ({user.target}), not by the "
                                "head's two gradient matmuls")
    head = {*logits_chain, *saved, nll, *nll.users, seed, backward, *grad_views, *replaced}
    outside = [(n, u) for n in head - set(replaced) for u in n.users if u not in head]
    if outside:
        node, user = outside[0]
        raise LossHeadError(f"{where}: '{node}' of the loss head is also read by '{user}': it cannot be chunked away")
    chunk_rows = max(1, chunk_bytes // (vocab * logits_chain[0].meta["val"].element_size()))
    return _rewritten(traced, head, replaced, nll, (hidden, weight, target, reduction, ignore_index, chunk_rows))


def _rewritten(traced: TracedStep, head: set[torch.fx.Node], replaced: dict[torch.fx.Node, int],
               at: torch.fx.Node, args: tuple) -> TracedStep:
    """A copy of ``traced`` without the ``head`` nodes: ``linear_cross_entropy(*args)`` in place of ``at``,
    its outputs read where the ``replaced`` nodes were; every node's fake value propagated again, so that a
    node reading the new op's outputs (a view of its weight gradient) aliases them as it does when run."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    outputs: list[torch.fx.Node] = []
    for node in traced.gm.graph.nodes:
        if node is at:
            fused = graph.create_node("call_function", linear_cross_entropy._opoverload,
                                      torch.fx.node.map_arg(args, env.__getitem__), name="linear_cross_entropy")
            fused.meta = {k: v for k, v in at.meta.items() if k != "val"}
            for i in range(3):
                outputs.append(graph.create_node("call_function", operator.getitem, (fused, i)))
                outputs[-1].meta = dict(fused.meta)
        if node in replaced:
            env[node] = outputs[replaced[node]]
        elif node not in head:
            env[node] = graph.node_copy(node, env.__getitem__)
    graph.eliminate_dead_code()
    gm = torch.fx.GraphModule(traced.gm, graph, class_name="StepWithChunkedLoss")
    inputs = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    FakeTensorProp(gm, inputs[0].fake_mode).propagate_dont_convert_inputs(*inputs)
    return TracedStep(traced.model, gm, traced.param_names, traced.buffer_names, traced.batch_names,
                      outputs[0].name)
