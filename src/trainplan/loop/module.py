"""The planned module: the user's model behind an ``nn.Module`` whose training call runs the compiled plan.

In training mode, a call runs the whole planned step (forward, loss and backward, as the plan schedules them)
inside one autograd function, which keeps the gradients and hands them to autograd at ``backward()``: they
land in the model's parameters' ``.grad`` as autograd's own would (accumulated, scaled by the loss's upstream
gradient). In eval mode a call runs the model itself, unplanned.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from functools import partial
from typing import Any, NamedTuple

import torch

from trainplan.execute.step import PlannedStep
from trainplan.loop.cache import BatchSignature, batch_signature
from trainplan.loop.errors import NewBatchShapeError
from trainplan.loop.planner import PlanSettings, plan_step
from trainplan.loop.report import PlanReport
from trainplan.loop.update_op import updates_bound
from trainplan.loop.updates import ParamUpdates

ON_NEW_SHAPE = ("replan", "raise")


class StepOutput(NamedTuple):
    """A keyword call's result, as a Hugging Face model's: the loss as ``.loss`` and ``[0]``."""

    loss: torch.Tensor


class _PlannedLoss(torch.autograd.Function):
    """Forward: the planned step's loss, its gradients kept (or, with ``updates``, applied in the step by the
    optimizer and freed). Backward: those gradients x the loss's upstream gradient, for the parameters (the
    batch gets none); with updates, none."""

    @staticmethod
    def forward(ctx: Any, step: PlannedStep, batch: Mapping[str, torch.Tensor], updates: ParamUpdates | None,
                *params: torch.Tensor) -> torch.Tensor:
        named = dict(zip(step.traced.param_names, params))
        if updates is None:
            loss, grads = step(named, batch)
            ctx.grads = [grads[name] for name in step.traced.param_names]
            return loss
        updates.clear()
        with updates_bound(updates):
            loss, _ = step(named, batch)
        ctx.grads = None
        ctx.updated = True
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grads, ctx.grads = ctx.grads, None  # handed over: autograd may take them as .grad without a copy
        needed = ctx.needs_input_grad[3:]
        if getattr(ctx, "updated", False):
            if not bool(grad_loss == 1):
                raise RuntimeError(UPDATED_IN_STEP)
            return None, None, None, *(None for _ in needed)
        if grads is None:
            raise RuntimeError("backward through a planned step twice: its gradients were handed over the first "
                               "time (retain_graph is not supported)")
        if bool(grad_loss == 1):
            return None, None, None, *(g if need else None for g, need in zip(grads, needed))
        scaled: list[torch.Tensor | None] = []
        for i, need in enumerate(needed):  # one gradient at a time: the unscaled one is freed as its copy is made
            scaled.append(grads[i] * grad_loss if need else None)
            grads[i] = None  # type: ignore[call-overload]
        return None, None, None, *scaled


UPDATED_IN_STEP = (
    "backward of a scaled loss through a planned step whose optimizer runs in the step: the parameters were "
    "updated from the unscaled gradients as the step ran. Gradient accumulation and loss scaling need every "
    "gradient before the update and are refused with the optimizer in the plan (plan without optimizer=)")


def _shape_change(planned: BatchSignature, new: BatchSignature) -> str:
    """The first difference between two batch signatures, named by key."""
    old, now = {s[0]: s[1:] for s in planned}, {s[0]: s[1:] for s in new}
    key = next(k for k in sorted({*old, *now}) if old.get(k) != now.get(k))

    def show(entry: tuple[Any, ...] | None) -> str:
        return "absent" if entry is None else f"shape {tuple(entry[0])} {entry[1]} on {entry[2]}"

    return f"batch key {key!r}: {show(now.get(key))}, the plan was made for {show(old.get(key))}"


class PlannedModule(torch.nn.Module):
    """``model`` trained under a memory plan (made by :func:`trainplan.plan`).

    Training mode: ``planned(batch)`` returns the loss, ``planned(**batch)`` a :class:`StepOutput` (``.loss``,
    as Hugging Face's ``Trainer`` reads it); ``loss.backward()`` puts the gradients in the model's parameters'
    ``.grad``. A batch whose keys, shapes or dtypes differ from the planned ones is planned for anew
    (``on_new_shape="replan"``) or refused (``"raise"``). Eval mode: a call runs ``model(**batch)`` unplanned
    and returns the model's own output. The module (and the model) start in training mode.
    ``planned.parameters()`` are the model's own Parameter objects (its ``state_dict`` keys start ``model.``)."""

    accepts_loss_kwargs = False  # Hugging Face's Trainer: pass no loss kwargs (the planned batch's keys are fixed)

    def __init__(self, model: torch.nn.Module, example_batch: Mapping[str, torch.Tensor], settings: PlanSettings,
                 on_new_shape: str) -> None:
        super().__init__()
        if on_new_shape not in ON_NEW_SHAPE:
            raise ValueError(f"on_new_shape={on_new_shape!r}: choose one of {ON_NEW_SHAPE}")
        self.model = model
        self.settings = settings
        self.on_new_shape = on_new_shape
        self._steps: dict[BatchSignature, tuple[PlannedStep, PlanReport]] = {}
        self._planned = self._current = self._signature(example_batch)
        self.updates = None if settings.optimizer is None else ParamUpdates(
            settings.optimizer, [p for _, p in model.named_parameters()], [n for n, _ in model.named_parameters()])
        self._steps[self._current] = plan_step(model, example_batch, settings, self.updates)
        # Hugging Face's Trainer keeps the dataset columns its model's forward names: name the model's inputs
        self.forward = partial(PlannedModule.forward, self)  # type: ignore[method-assign]
        self.forward.__signature__ = inspect.signature(model.forward)  # type: ignore[attr-defined]
        self.train()  # a planned module is for training (the model too): eval() is the caller's choice

    @property
    def report(self) -> PlanReport:
        """The report of the plan the last training call ran (of the example batch's plan before any)."""
        return self._steps[self._current][1]

    @property
    def step(self) -> PlannedStep:
        """The compiled step the last training call ran."""
        return self._steps[self._current][0]

    @staticmethod
    def _signature(batch: Mapping[str, Any]) -> BatchSignature:
        wrong = [f"{k!r} ({type(v).__name__})" for k, v in batch.items() if not isinstance(v, torch.Tensor)]
        if wrong:
            raise TypeError(f"a planned step takes a batch of tensors; not {', '.join(wrong)}")
        return batch_signature(batch)

    def forward(self, batch: Mapping[str, torch.Tensor] | None = None, /, **inputs: torch.Tensor) -> Any:
        merged = {**(batch or {}), **inputs}
        if not self.training:
            return self.model(**merged)
        signature = self._signature(merged)
        if signature not in self._steps:
            if self.on_new_shape == "raise":
                raise NewBatchShapeError(f"{_shape_change(self._planned, signature)} (on_new_shape='raise'; "
                                         "'replan' plans for the new shape)")
            self._steps[signature] = plan_step(self.model, merged, self.settings, self.updates)
        self._current = signature
        step = self._steps[signature][0]
        named = dict(self.model.named_parameters())
        loss = _PlannedLoss.apply(step, merged, self.updates, *(named[n] for n in step.traced.param_names))
        return loss if batch is not None else StepOutput(loss)
