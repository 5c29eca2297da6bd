"""``trainplan.plan``: one call that traces, profiles and solves a model's training step under a memory budget
and returns a module to train with in any loop (docs/plan_api.md)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from trainplan.budget import parse_budget, parse_bytes
from trainplan.loop.cache import cache_dir as resolve_cache_dir
from trainplan.loop.module import PlannedModule
from trainplan.loop.planner import ON_INFEASIBLE, PlanSettings
from trainplan.models import default_loss


def plan(model: torch.nn.Module, example_batch: Mapping[str, torch.Tensor], budget: str | int | float, *,
         loss_fn: Callable[[Any], torch.Tensor] = default_loss, time_limit_s: float = 10.0,
         on_infeasible: str = "raise", on_new_shape: str = "replan", cache_dir: str | os.PathLike[str] | None = None,
         progress: bool = True, swap: bool | None = None, workers: int = 1, seed: int = 0,
         profile_repeats: int = 3, optimizer: torch.optim.Optimizer | None = None,
         loss_chunk: str | int | None = None) -> PlannedModule:
    """``model`` planned to train on batches like ``example_batch`` (keyword inputs of ``model``) within
    ``budget``: bytes (``"2GiB"``, ``"1500MB"``, an int) or a fraction in (0, 1] of the step's no-recompute
    peak (:mod:`trainplan.budget`). ``loss_fn`` turns the model's output into the loss (default: its
    ``.loss``). The step is traced, then its plan read from the cache (``cache_dir``, else
    ``$TRAINPLAN_PLAN_CACHE``, else ``~/.cache/trainplan/plans``) or made: profiled (``profile_repeats``),
    and solved in ``time_limit_s`` with ``workers`` and ``seed``. ``swap``: whether the plan may swap tensors to
    the host (default: not on the CPU, where the host is the same memory). A budget no schedule was found
    within raises InfeasibleBudgetError (``on_infeasible="raise"``) or is raised to the least budget found
    (``"raise_budget"``; ``planned.report`` says so). ``progress``: tqdm bars while tracing, profiling and
    solving. ``optimizer`` (over the model's parameters): its updates run inside the planned step, each
    parameter's as soon as its gradient is complete, and the gradient is freed (below the peak that holding
    every gradient sets); the call ``planned(batch)`` then trains the step, ``optimizer.step()`` finds no
    gradient and does nothing, and a scaled loss's backward (gradient accumulation) raises. ``loss_chunk``
    (bytes: ``"64MiB"``): the language-model loss head (logits matmul + cross-entropy, and its backward) runs as
    one op over row chunks whose logits hold at most that (:mod:`trainplan.export.loss_head`), below the three
    full logits-sized tensors the head holds otherwise; a step without that head raises LossHeadError."""
    if on_infeasible not in ON_INFEASIBLE:
        raise ValueError(f"on_infeasible={on_infeasible!r}: choose one of {ON_INFEASIBLE}")
    chunk = None if loss_chunk is None else parse_bytes(loss_chunk, "loss_chunk")
    settings = PlanSettings(parse_budget(budget), loss_fn, float(time_limit_s), workers, seed, swap, profile_repeats,
                            on_infeasible, resolve_cache_dir(cache_dir), progress, optimizer, chunk)
    return PlannedModule(model, example_batch, settings, on_new_shape)
