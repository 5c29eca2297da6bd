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


GRAD_ERROR_FACTOR = 10.0  # a plan's gradient may be this many times further from float64 than the unmodified step's


def _step_grads(module: torch.nn.Module, batch: dict[str, torch.Tensor], loss_fn: Callable[[Any], torch.Tensor]
                ) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and parameter gradients (as float64) of one training step; the module's state is restored."""
    state = copy.deepcopy(module.state_dict())
    loss = float(train_step(module, batch, loss_fn))
    grads = {n: p.grad.double() for n, p in module.named_parameters() if p.grad is not None}
    module.load_state_dict(state)
    return loss, grads


def _errors(grads: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per parameter: largest absolute gradient error (inf where one of the two has no gradient)."""
    errors = {n: float("inf") for n in set(grads) ^ set(exact)}
    errors.update({n: (grads[n] - g).abs().max().item() for n, g in exact.items() if n in grads})
    return errors


def check_gradients(reference: torch.nn.Module, other: torch.nn.Module, batch: dict[str, torch.Tensor],
                    loss_fn: Callable[[Any], torch.Tensor], rtol: float, atol: float) -> dict[str, Any]:
    """Loss and every parameter gradient of one step of ``other`` and of the unmodified float32 ``reference``
    against the exact step (``reference`` in float64). ``ok`` when each of ``other``'s largest errors (per
    parameter, and the loss) is at most atol + max(rtol x the exact value's largest entry, GRAD_ERROR_FACTOR x
    the unmodified step's error there): a plan only changes the order of float32 sums, and on deep CNNs with
    batch norm over a few values the unmodified float32 step is itself far from exact on some parameters
    (ResNet-50 at 2 x 64 px: up to 14% of the largest entry), so a match to it within rtol would fail any
    reordering. ``worst_grad_ratio``: the largest error over its allowance. Module states are restored."""
    exact_loss, exact = _step_grads(copy.deepcopy(reference).double(), _as_double(batch), loss_fn)
    ref_loss, ref = _step_grads(reference, batch, loss_fn)
    loss, grads = _step_grads(other, batch, loss_fn)
    ref_errors, errors = _errors(ref, exact), _errors(grads, exact)

    def allowed(scale: float, ref_error: float) -> float:
        return atol + max(rtol * scale, GRAD_ERROR_FACTOR * ref_error)

    ratios = {n: e / allowed(exact[n].abs().max().item() if n in exact else 0.0, ref_errors.get(n, 0.0))
              for n, e in errors.items()}
    worst = max(ratios, key=lambda n: (ratios[n], n), default="")
    loss_ok = abs(loss - exact_loss) <= allowed(abs(exact_loss), abs(ref_loss - exact_loss))
    return {"ok": bool(loss_ok and ratios.get(worst, 0.0) <= 1.0), "loss": loss, "reference_loss": ref_loss,
            "exact_loss": exact_loss, "worst_grad_ratio": ratios.get(worst, 0.0), "worst_grad_param": worst,
            "worst_grad_error": errors.get(worst, 0.0), "reference_grad_error": ref_errors.get(worst, 0.0)}


def _as_double(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}


def time_steps(runnables: list[Runnable], batch: dict[str, torch.Tensor], loss_fn: Callable[[Any], torch.Tensor],
               timing: Timing) -> dict[str, dict[str, Any]]:
    """Median step time per runnable; runs alternate between runnables in each round so that a change of load
    hits all of them alike. Each run starts from the runnable's initial state."""
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
        out[name] = {"median_s": median, "min_s": times[0], "max_s": times[-1], "samples": len(times)}
    out["_load"] = {"min": min(loads), "max": max(loads)}
    return out
