"""An embedding's gradient added into another gradient of its weight as one op: ``trainplan::embedding_grad_add``.

``embedding_grad_add(other, grad_output, indices)`` equals ``other + embedding_dense_backward(grad_output,
indices, other.shape[0], -1, False)`` without the dense table: the gradient rows of each distinct index are
summed in token order from zero (as the CPU embedding backward sums them), then added to ``other``'s row, into a
copy of ``other``. On CPU the result is eager's, value for value (a ``-0.0`` of ``other`` outside the looked-up
rows stays ``-0.0`` where eager's ``+ 0.0`` makes it ``+0.0``); elsewhere within round-off.

``embedding_grad_add_`` (schema ``Tensor(a!) other -> Tensor(a!)``) adds the same rows into ``other`` itself and
returns it, as ``torch.compile``'s embedding backward writes into the other gradient's buffer: no copy of the table
and one table live instead of two. Its fake value is ``other``, so the exported tables give it no storage of its
own. The fold pass uses it where nothing else reads ``other``.
"""

from __future__ import annotations

import torch


def _add_rows(out: torch.Tensor, other: torch.Tensor, grad_output: torch.Tensor, indices: torch.Tensor) -> None:
    """Write ``other``'s rows plus the embedding gradient's, at the looked-up rows, into ``out``."""
    flat = indices.reshape(-1)
    rows, inverse = torch.unique(flat, return_inverse=True)
    grads = grad_output.reshape(flat.numel(), other.shape[1])
    sums = grads.new_zeros(rows.numel(), other.shape[1]).index_add_(0, inverse, grads)  # token order, from 0
    out.index_put_((rows,), (other[rows] + sums).to(out.dtype))  # in place into half: as ``add_`` casts down


@torch.library.custom_op("trainplan::embedding_grad_add", mutates_args=())
def embedding_grad_add(other: torch.Tensor, grad_output: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``other`` (rows x features) plus the embedding gradient of ``grad_output`` (indices' shape x features)
    looked up at ``indices``."""
    out = other.clone(memory_format=torch.contiguous_format)
    _add_rows(out, other, grad_output, indices)
    return out


@embedding_grad_add.register_fake
def _embedding_grad_add_fake(other: torch.Tensor, grad_output: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(other, memory_format=torch.contiguous_format)


torch.library.define("trainplan::embedding_grad_add_",
                     "(Tensor(a!) other, Tensor grad_output, Tensor indices) -> Tensor(a!)")


@torch.library.impl("trainplan::embedding_grad_add_", "CompositeExplicitAutograd")
def _embedding_grad_add_inplace(other: torch.Tensor, grad_output: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    _add_rows(other, other, grad_output, indices)
    return other


@torch.library.register_fake("trainplan::embedding_grad_add_")
def _embedding_grad_add_inplace_fake(other: torch.Tensor, grad_output: torch.Tensor,
                                     indices: torch.Tensor) -> torch.Tensor:
    return other


#: the in-place op, ``trainplan::embedding_grad_add_``
embedding_grad_add_ = torch.ops.trainplan.embedding_grad_add_.default


def flops(other: torch.Tensor, grad_output: torch.Tensor, indices: torch.Tensor) -> float:
    """One addition per gradient element and one per looked-up row element (at most the tokens' rows)."""
    return 2.0 * grad_output.numel()


def workspace_bytes(other: torch.Tensor, grad_output: torch.Tensor, indices: torch.Tensor) -> int:
    """What a call holds besides its output, at most: the row sums, the gathered rows of ``other`` and their sum
    (each one row per token at most: the distinct count is known only when run), and the index vectors."""
    return 3 * grad_output.numel() * grad_output.element_size() + 2 * indices.numel() * 8
