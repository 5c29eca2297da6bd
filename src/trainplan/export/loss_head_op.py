"""The language-model loss head as one op computed in row chunks: ``trainplan::linear_cross_entropy``.

``linear_cross_entropy(hidden, weight, target, ...)`` returns the cross-entropy of ``hidden @ weight.T``
against ``target`` (as ``aten.nll_loss_forward(aten._log_softmax(...))``) together with the gradients of
that loss with respect to ``hidden`` and ``weight``, computed chunk by chunk over the rows: only one chunk of
logits (``chunk_rows x vocabulary``) exists at a time, where the traced step holds the whole logits, their
log-softmax and the logits' gradient (three ``rows x vocabulary`` tensors). The gradients are the loss's own
(an upstream gradient of 1, as the traced step's loss has): the pass that puts the op in a step
(:mod:`trainplan.export.loss_head`) checks that. This is the fused linear cross-entropy of Liger-Kernel and
of Apple's Cut Cross-Entropy, here in PyTorch ops on any device.
"""

from __future__ import annotations

import torch

#: aten.nll_loss_forward's reduction codes
MEAN, SUM = 1, 2


@torch.library.custom_op("trainplan::linear_cross_entropy", mutates_args=())
def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, reduction: int,
                         ignore_index: int, chunk_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, d loss / d hidden, d loss / d weight)`` for ``hidden`` (rows x features), ``weight``
    (vocabulary x features) and ``target`` (rows), ``reduction`` MEAN or SUM over the rows whose target is
    not ``ignore_index``, computed ``chunk_rows`` rows at a time."""
    valid = target != ignore_index
    count = valid.sum(dtype=torch.float64)
    scale = 1.0 / max(float(count), 1.0) if reduction == MEAN else 1.0  # no valid row: every gradient is 0
    total = torch.zeros((), dtype=torch.float64, device=hidden.device)
    grad_hidden = torch.empty_like(hidden)
    grad_weight = torch.zeros_like(weight)
    for start in range(0, hidden.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        h, keep = hidden[rows], valid[rows]
        picked = target[rows].where(keep, 0)[:, None]
        grad = torch.mm(h, weight.t())  # the logits: the one chunk-sized buffer (workspace_bytes)
        top = grad.amax(1, keepdim=True)
        chosen = grad.gather(1, picked)
        sums = grad.sub_(top).exp_().sum(1, keepdim=True)
        total += ((sums.log() + top - chosen).squeeze(1) * keep).sum(dtype=torch.float64)  # log-sum-exp - logit
        grad.div_(sums)  # softmax
        grad.scatter_add_(1, picked, torch.full_like(picked, -1, dtype=grad.dtype))
        grad.mul_(keep[:, None].to(grad.dtype) * scale)
        torch.mm(grad, weight, out=grad_hidden[rows])
        grad_weight.addmm_(grad.t(), h)
        del grad, h, keep, picked, top, chosen, sums  # else the next chunk's logits are made while these are held
    loss = total / count if reduction == MEAN else total  # no valid row: nan, as nll_loss's mean
    return loss.to(hidden.dtype), grad_hidden, grad_weight


def flops(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, reduction: int, ignore_index: int,
          chunk_rows: int) -> float:
    """The three matmuls' FLOPs (logits, the hidden state's gradient, the weight's), as the head's unchunked ops."""
    return 6.0 * hidden.shape[0] * hidden.shape[1] * weight.shape[0]


def workspace_bytes(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, reduction: int,
                    ignore_index: int, chunk_rows: int) -> int:
    """What a call holds besides its outputs: one chunk of logits, and an estimate of the small tensors beside it
    (the rows' valid mask, the float64 sums, and per chunk row its target index and five float temporaries of the
    loss and softmax arithmetic; a pipeline rank measured 4 B more than its plan with 8 KiB chunks)."""
    rows = min(chunk_rows, hidden.shape[0])
    small = target.numel() + 2 * 8 + rows * (target.element_size() + 5 * hidden.element_size())
    return rows * weight.shape[0] * hidden.element_size() + small


@linear_cross_entropy.register_fake
def _linear_cross_entropy_fake(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, reduction: int,
                               ignore_index: int, chunk_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return hidden.new_empty(()), torch.empty_like(hidden), torch.empty_like(weight)
