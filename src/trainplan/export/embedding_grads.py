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
promotes). Where nothing else reads ``g``'s storage (``g`` and each view it is taken through have the sum as their
only reader, down to the op that made the storage), the sum is ``trainplan::embedding_grad_add_``, written into
``g`` itself: one table live, no copy.
"""

from __future__ import annotations

import torch
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from trainplan.export.embedding_grad_op import embedding_grad_add, embedding_grad_add_
from trainplan.export.traced_step import TracedStep, is_view_node

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


def _only_reader(other: torch.fx.Node) -> bool:
    """Whether ``other``'s storage is read by the sum alone: ``other`` and each view it is taken through have one
    reader, down to a computed (not a view, not an input) node."""
    node = other
    while True:
        if node.op != "call_function" or len(node.users) != 1:
            return False
        if not is_view_node(node):
            return True
        node = node.args[0]


def fold_embedding_gradient_sums(traced: TracedStep, in_place: bool = True) -> TracedStep:
    """``traced`` (changed in place) with every foldable ``add(g, embedding_dense_backward(...))`` (either
    order) replaced by ``embedding_grad_add`` into ``g`` (with ``in_place``, ``embedding_grad_add_`` where
    ``g``'s storage has no other reader). The new node carries the embedding backward's
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
            op = embedding_grad_add_ if in_place and _only_reader(other) else embedding_grad_add._opoverload
            # one name in either form: a pipeline's plan (functional) names the node the export (in place) does
            summed = graph.create_node("call_function", op, (other, grad_out, indices), name="embedding_grad_add")
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
