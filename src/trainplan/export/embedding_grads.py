"""A pass on a traced training step: an embedding's gradient added to another gradient of the same weight (a
tied weight, as GPT-2's token embedding and LM head) is added row by row into that gradient instead.

Autograd computes such a sum as ``add(g_other, embedding_dense_backward(g_out, indices, V, -1, False))``: the
embedding's gradient is a zero-filled ``V x H`` table with a few rows written, then added element by element:
three ``V x H`` tensors live at the add, the table written twice and read once more. The pass puts
``trainplan::embedding_grad_add(g_other, g_out, indices)`` (:mod:`trainplan.export.embedding_grad_op`) in its
place: a copy of ``g_other`` with the looked-up rows added, two tables live instead of three, the zero fill and
the dense add gone (``torch.compile`` fuses the add into its embedding backward kernel to the same end), and on
CPU the same values as eager's.

Folded only where the rewrite is exact: ``padding_idx`` -1 and ``scale_grad_by_freq`` off (the defaults), the
embedding's gradient read by the add alone, both operands of one shape and dtype (the add neither broadcasts nor
promotes).
"""

from __future__ import annotations

import torch
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from trainplan.export.embedding_grad_op import embedding_grad_add
from trainplan.export.traced_step import TracedStep

aten = torch.ops.aten


def _embedding_grad(node: object) -> torch.fx.Node | None:
    """``node`` if it is a foldable ``embedding_dense_backward`` read by one node, else None."""
    if not (isinstance(node, torch.fx.Node) and node.target is aten.embedding_dense_backward.default):
        return None
    _grad, _indices, _rows, padding_idx, scale_by_freq = node.args
    val = node.meta.get("val")
    foldable = padding_idx == -1 and not scale_by_freq and len(node.users) == 1 and isinstance(val, torch.Tensor)
    return node if foldable else None


def _same_table(node: object, table: torch.fx.Node) -> bool:
    """Whether ``node`` is a tensor of ``table``'s shape and dtype (so the add neither broadcasts nor promotes)."""
    val, ref = getattr(node, "meta", {}).get("val"), table.meta["val"]
    return isinstance(val, torch.Tensor) and val.shape == ref.shape and val.dtype == ref.dtype


def fold_embedding_gradient_sums(traced: TracedStep) -> TracedStep:
    """``traced`` (changed in place) with every foldable ``add(g, embedding_dense_backward(...))`` (either
    order) replaced by ``embedding_grad_add`` into ``g``. The new node carries the embedding backward's
    metadata (its module and autograd sequence number); fake values are propagated again where a sum was
    folded, so that views of the new node alias it."""
    graph = traced.gm.graph
    folded = 0
    for add in list(graph.nodes):
        if add.target is not aten.add.Tensor or add.kwargs.get("alpha", 1) != 1 or len(add.args) != 2:
            continue
        left, right = add.args
        table, other = _embedding_grad(right), left
        if table is None:
            table, other = _embedding_grad(left), right
        if table is None or not _same_table(other, table):
            continue
        grad_out, indices = table.args[:2]
        with graph.inserting_before(add):
            summed = graph.call_function(embedding_grad_add._opoverload, (other, grad_out, indices))
        summed.meta = {**table.meta, "val": add.meta["val"]}  # the sum's value until propagated below
        add.replace_all_uses_with(summed)
        graph.erase_node(add)
        graph.erase_node(table)
        folded += 1
    if folded:
        traced.gm.recompile()
        inputs = [n.meta["val"] for n in graph.nodes if n.op == "placeholder"]
        FakeTensorProp(traced.gm, inputs[0].fake_mode).propagate_dont_convert_inputs(*inputs)
    return traced
