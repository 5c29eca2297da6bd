"""Execute layout plans on the real model: per-conv input conversion (a forward pre-hook) and weights converted
ahead of time, then the training step (forward + backward) timed per plan and checked against the unmodified
step's loss and gradients."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainplan.layout.measure import Timing, load_average, memory_format
from trainplan.timing import gc_paused


@dataclass
class Runnable:
    """A model copy prepared for one plan, and the hooks that convert conv inputs."""

    name: str
    module: torch.nn.Module
    hooks: list[Any]


def apply_layouts(module: torch.nn.Module, layouts: dict[str, str], name: str = "plan") -> Runnable:
    """A deep copy of ``module`` whose Conv2d ``c`` runs in ``layouts[c]``: its weight is stored in that memory
    format now, and a pre-hook converts its input (a no-op when the input already is in it). Other ops follow
    the layout of their inputs, as PyTorch propagates memory formats."""
    model = copy.deepcopy(module)
    convs = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)}
    missing = sorted(set(layouts) - set(convs) - {"input"})
    if missing:
        raise KeyError(f"plan '{name}' names layouts for unknown conv module(s) {missing[:5]}")
    hooks = []
    for cname, conv in convs.items():
        fmt = memory_format(layouts.get(cname, "nchw"))
        with torch.no_grad():
            conv.weight.data = conv.weight.data.contiguous(memory_format=fmt)

        def convert(_mod: torch.nn.Module, args: tuple[Any, ...], fmt: torch.memory_format = fmt) -> tuple[Any, ...]:
            return (args[0].contiguous(memory_format=fmt), *args[1:])

        hooks.append(conv.register_forward_pre_hook(convert))
    return Runnable(name, model, hooks)


def train_step(module: torch.nn.Module, batch: dict[str, torch.Tensor], loss_fn: Callable[[Any], torch.Tensor]
               ) -> torch.Tensor:
    """One forward + backward with fresh gradients; returns the loss."""
    for p in module.parameters():
        p.grad = None
    loss = loss_fn(module(**batch))
    loss.backward()
    return loss.detach()


FLOAT32_ERROR_FACTOR = 3.0  # a plan's float32 gradient may be this many times further from exact than the
# unmodified float32 step's gradient of the same parameter


def _step_grads(module: torch.nn.Module, batch: dict[str, torch.Tensor], loss_fn: Callable[[Any], torch.Tensor]
                ) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and parameter gradients (as float64) of one training step; the module's state is restored."""
    state = copy.deepcopy(module.state_dict())
    loss = float(train_step(module, batch, loss_fn))
    grads = {n: p.grad.double() for n, p in module.named_parameters() if p.grad is not None}
    module.load_state_dict(state)
    return loss, grads


def _errors(grads: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> dict[str, float]:
    """Largest absolute error of each parameter's gradient (inf where one of the two has no gradient)."""
    return {n: (grads[n] - exact[n]).abs().max().item() if n in grads and n in exact else float("inf")
            for n in sorted(set(grads) | set(exact))}


def _worst(errors: dict[str, float], bounds: dict[str, float]) -> tuple[float, str]:
    """Largest error over its bound, and its parameter."""
    ratios = {n: 0.0 if e == 0 else e / bounds[n] if bounds.get(n, 0.0) > 0 else float("inf") for n, e in errors.items()}
    worst = max(ratios, key=lambda n: (ratios[n], n), default="")
    return ratios.get(worst, 0.0), worst


def _relative_bounds(exact: dict[str, torch.Tensor], rtol: float, atol: float) -> dict[str, float]:
    """``atol + rtol x`` each exact gradient's largest entry."""
    return {n: atol + rtol * g.abs().max().item() for n, g in exact.items()}


@dataclass(frozen=True)
class GradientReference:
    """One training step of the unmodified model: exact (float64) and as run (float32); the float32 step's
    largest gradient error per parameter, and its worst relative to the parameter's largest exact entry among
    the parameters where that is below 1 (the gradient is not round-off alone)."""

    exact_loss: float
    exact: dict[str, torch.Tensor]
    loss: float
    float32_errors: dict[str, float]
    float32_error: float


def gradient_reference(reference: torch.nn.Module, batch: dict[str, torch.Tensor],
                       loss_fn: Callable[[Any], torch.Tensor], atol: float) -> GradientReference:
    """The unmodified step that :func:`check_gradients` compares plans with (computed once per model)."""
    exact_loss, exact = _step_grads(copy.deepcopy(reference).double(), _as_double(batch), loss_fn)
    loss, grads = _step_grads(reference, batch, loss_fn)
    errors = _errors(grads, exact)
    bounds = _relative_bounds(exact, 1.0, atol)
    # gradients the float32 step gets at least roughly right; one that is round-off alone (a bias just before a
    # batch norm: exact gradient ~0) would set the allowance of every other parameter, and has its own term
    signal = {n: e for n, e in errors.items() if e < bounds.get(n, 0.0)}
    return GradientReference(exact_loss, exact, loss, errors, _worst(signal, bounds)[0])


def check_gradients(reference: GradientReference, other: torch.nn.Module, batch: dict[str, torch.Tensor],
                    loss_fn: Callable[[Any], torch.Tensor], rtol: float, atol: float) -> dict[str, Any]:
    """One training step of ``other`` (a plan) against the unmodified step, checked twice.
    Exact: ``other`` run in float64 must agree with the exact step within rtol/atol, loss and every gradient (a
    plan only reorders sums, so a wrong conversion shows here). Float32: each parameter's largest gradient error against the
    exact step must be at most atol + the larger of ``allowed`` x that gradient's largest entry, ``allowed`` =
    max(rtol, FLOAT32_ERROR_FACTOR x the unmodified float32 step's worst such relative error below 1), and
    FLOAT32_ERROR_FACTOR x the unmodified float32 step's own error on that parameter. On deep CNNs whose batch
    norms see a few values the float32 step is itself far from exact (ResNet-50 at 2 x 64 px: 14%), and a
    parameter whose exact gradient is ~0 (a bias just before a batch norm) gets round-off alone, so matching
    within rtol fails any reordering; this catches a wrong float32 kernel. Module states are restored."""
    plan_loss, plan = _step_grads(copy.deepcopy(other).double(), _as_double(batch), loss_fn)
    loss, grads = _step_grads(other, batch, loss_fn)
    exact_ratio, exact_param = _worst(_errors(plan, reference.exact), _relative_bounds(reference.exact, rtol, atol))
    exact_ratio = max(exact_ratio, abs(plan_loss - reference.exact_loss) / (atol + rtol * abs(reference.exact_loss)))
    relative = _relative_bounds(reference.exact, max(rtol, FLOAT32_ERROR_FACTOR * reference.float32_error), 0.0)
    bounds = {n: atol + max(relative[n], FLOAT32_ERROR_FACTOR * reference.float32_errors.get(n, 0.0)) for n in relative}
    float32_ratio, param = _worst(_errors(grads, reference.exact), bounds)
    return {"ok": bool(exact_ratio <= 1.0 and float32_ratio <= 1.0), "loss": loss, "reference_loss": reference.loss,
            "exact_loss": reference.exact_loss, "exact_ratio": exact_ratio, "exact_param": exact_param,
            "float32_allowed_factor": FLOAT32_ERROR_FACTOR, "float32_param": param, "reference_float32_error": reference.float32_error,
            "float32_ratio": float32_ratio, "worst_grad_ratio": max(exact_ratio, float32_ratio)}


def _as_double(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}


def time_steps(runnables: list[Runnable], batch: dict[str, torch.Tensor], loss_fn: Callable[[Any], torch.Tensor],
               timing: Timing) -> dict[str, dict[str, Any]]:
    """Median step time per runnable; runs alternate between runnables in each round so that a change of load
    hits all of them alike (``samples_s``: the times in round order, paired across runnables). Each run starts
    from the runnable's initial state."""
    torch.set_num_threads(timing.threads)
    now = timing.now
    samples: dict[str, list[float]] = {r.name: [] for r in runnables}
    loads = []
    with gc_paused():
        for r in runnables:
            for _ in range(timing.warmup):
                train_step(r.module, batch, loss_fn)
        for _ in range(timing.repeats):
            for r in runnables:
                t0 = now()
                train_step(r.module, batch, loss_fn)
                samples[r.name].append(now() - t0)
            loads.append(load_average())
    out = {}
    for name, times in samples.items():
        times = sorted(times)
        mid = len(times) // 2
        median = times[mid] if len(times) % 2 else 0.5 * (times[mid - 1] + times[mid])
        out[name] = {"median_s": median, "min_s": times[0], "max_s": times[-1], "samples": len(times),
                     "samples_s": samples[name]}
    out["_load"] = {"min": min(loads), "max": max(loads)}
    return out
