"""A pipeline rank's loss and gradients against the single-process step of the same plan (bit for bit; a tied
parameter reduced once per step within round-off) and against eager autograd (within round-off), each combined
over the micro-batches as the pipeline combines them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainplan.execute.plan import StagePlan
from trainplan.execute.step import compile_step
from trainplan.export.tables import GraphTables
from trainplan.export.trace import TracedStep
from trainplan.models import BuiltModel

#: eager autograd against the pipeline: float32 round-off of a different summation order
EAGER_RTOL, EAGER_ATOL = 1e-5, 1e-6
COMBINED = ("loss: the mean of the micro-batch losses (the batch's mean loss for a mean loss over equal "
            "micro-batches); gradients: summed in micro-batch order, then divided by m (PipelineStage's "
            "accumulation and scale_grads)")


@dataclass
class Reference:
    """The plan and the traced step a rank compiled its stage from: enough to compile the whole step."""

    data: dict[str, Any]
    stages: list[StagePlan]
    traced: TracedStep
    flat: list[torch.Tensor]
    tables: GraphTables


def combine(grads: list[torch.Tensor]) -> torch.Tensor:
    """Gradients of the micro-batches as the pipeline leaves them: accumulated in order, divided by m."""
    out = grads[0].clone()
    for g in grads[1:]:
        out += g
    return out.div_(len(grads)) if len(grads) > 1 else out


def _eager(built: BuiltModel, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    params = list(built.module.parameters())
    loss = built.loss_fn(built.module(**batch))
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return loss.detach(), [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((float((x.double() - y.double()).abs().max()) for x, y in zip(a, b) if x.numel()), default=0.0)


def compare_with_references(grads: dict[str, torch.Tensor], losses: list[torch.Tensor], built: BuiltModel,
                            micro_batches: list[dict[str, torch.Tensor]], ref: Reference, *, where: str,
                            tied: frozenset[str] = frozenset()) -> dict[str, Any]:
    """This rank's gradients (``grads``, by parameter name: those its stage computes) and micro-batch losses (the
    last rank's; empty elsewhere) against the single-process planned step and eager autograd on each micro-batch.
    ``tied``: parameters whose partial gradients were reduced once per step (their terms summed in another
    order: compared within the eager tolerance, not bit for bit)."""
    step = compile_step(ref.data, ref.stages, ref.traced, ref.flat, ref.tables, where=where)
    params = dict(built.module.named_parameters())
    planned = [step(params, mb) for mb in micro_batches]
    eager = [_eager(built, mb) for mb in micro_batches]
    order = {name: i for i, name in enumerate(params)}
    names = list(grads)
    mine = [grads[n] for n in names]
    planned_grads = [combine([g[n] for _, g in planned]) for n in names]
    eager_grads = [combine([g[order[n]] for _, g in eager]) for n in names]
    out: dict[str, Any] = {"combined": COMBINED, "parameters": names}
    pairs = list(zip(names, mine, planned_grads))
    out["planned"] = {"bit_identical": all(torch.equal(a, b) for n, a, b in pairs if n not in tied),
                      "max_abs_diff_grad": _max_diff(mine, planned_grads),
                      "tied_reduced": sorted(tied.intersection(names)),
                      "tied_reduced_close": all(torch.allclose(a, b, rtol=EAGER_RTOL, atol=EAGER_ATOL)
                                                for n, a, b in pairs if n in tied)}
    close = all(torch.allclose(a, b, rtol=EAGER_RTOL, atol=EAGER_ATOL) for a, b in zip(mine, eager_grads))
    out["eager"] = {"close": close, "rtol": EAGER_RTOL, "atol": EAGER_ATOL,
                    "max_abs_diff_grad": _max_diff(mine, eager_grads)}
    if losses:
        ref_losses = [loss for loss, _ in planned]
        out["planned"]["bit_identical"] &= all(torch.equal(a, b) for a, b in zip(losses, ref_losses))
        out["planned"]["max_abs_diff_loss"] = _max_diff(losses, ref_losses)
        eager_losses = [loss for loss, _ in eager]
        out["eager"]["max_abs_diff_loss"] = _max_diff(losses, eager_losses)
        out["eager"]["close"] &= all(torch.allclose(a, b, rtol=EAGER_RTOL, atol=EAGER_ATOL)
                                     for a, b in zip(losses, eager_losses))
        batch = {n: torch.cat([mb[n] for mb in micro_batches]) for n in micro_batches[0]}
        with torch.no_grad():
            out["eager"]["full_batch_loss"] = float(built.loss_fn(built.module(**batch)))
        out["eager"]["mean_micro_batch_loss"] = float(torch.stack([loss for loss, _ in eager]).mean())
    return out
