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


def check_gradients(reference: torch.nn.Module, other: torch.nn.Module, batch: dict[str, torch.Tensor],
                    loss_fn: Callable[[Any], torch.Tensor], rtol: float, atol: float) -> dict[str, Any]:
    """Loss and every parameter gradient of one step of ``other`` against ``reference`` (both from the same
    state: BN statistics are restored afterwards)."""
    states = [copy.deepcopy(m.state_dict()) for m in (reference, other)]
    ref_loss, loss = train_step(reference, batch, loss_fn), train_step(other, batch, loss_fn)
    worst, worst_name, ok = 0.0, "", bool(torch.allclose(loss, ref_loss, rtol=rtol, atol=atol))
    for (name, p), (_, q) in zip(reference.named_parameters(), other.named_parameters()):
        if p.grad is None and q.grad is None:
            continue
        diff = (p.grad - q.grad).abs().max().item() if p.grad is not None and q.grad is not None else float("inf")
        rel = diff / (atol + rtol * p.grad.abs().max().item()) if p.grad is not None else float("inf")
        if rel > worst:
            worst, worst_name = rel, name
        ok = ok and rel <= 1.0
    for m, s in zip((reference, other), states):
        m.load_state_dict(s)
    return {"ok": ok, "loss": float(loss), "reference_loss": float(ref_loss), "worst_grad_ratio": worst,
            "worst_grad_param": worst_name}


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
