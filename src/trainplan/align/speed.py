"""Speed of a half-precision op on its planned aligned shapes against its own shapes, on the op's device.

Three times per op, each the median of ``repeats`` runs (after ``warmup``) of ``calls`` back-to-back calls,
read by a clock that waits for a GPU's queued work:

* ``plain_s``: the op on its own (unaligned) tensors;
* ``aligned_s``: the computation on the padded tensors alone (the aten op, or the masked batch norm), as a
  graph whose tensors stay padded between ops would run it;
* ``padded_run_s``: pad, compute, unpad: the op padded on its own, as ``execute.run_padded`` runs it.

Each of the three gets its own copy of the arguments: an in-place op writes into it, never into the step's values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from trainplan.align.execute import native_call, run_padded
from trainplan.align.problem import Problem
from trainplan.clock import median_seconds, synced_clock


@dataclass(frozen=True)
class OpClock:
    """Median of ``repeats`` timed runs after ``warmup`` runs, each of ``calls`` back-to-back calls (time per call)."""

    repeats: int = 5
    warmup: int = 2
    calls: int = 1

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.warmup < 0 or self.calls < 1:
            raise ValueError(f"op clock: repeats and calls must be at least 1 and warmup at least 0, not {self}")

    def time(self, fn: Callable[[], Any], device: torch.device) -> float:
        """Seconds per call of ``fn`` on ``device``."""
        return median_seconds(fn, synced_clock(device), self.repeats, self.warmup, self.calls)


@dataclass(frozen=True)
class OpSpeed:
    """Seconds per call of one op: plain, the computation on aligned shapes, and padded on its own."""

    plain_s: float
    aligned_s: float
    padded_run_s: float


def _copy(bound: dict[str, Any]) -> dict[str, Any]:
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, bound)


def _device(bound: dict[str, Any]) -> torch.device:
    for leaf in tree_leaves(bound):
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    return torch.device("cpu")


def op_speed(target: Any, bound: dict[str, Any], problem: Problem, padded: dict[str, int],
             out_shapes: list[tuple[int, ...]], clock: OpClock) -> OpSpeed:
    """Time the op ``target`` (arguments ``bound`` by schema name) plain, on its aligned tensors, and padded."""
    device = _device(bound)
    plain_args = _copy(bound)
    plain = clock.time(lambda: target(**plain_args), device)
    kernels: list[float] = []

    def timed(fn: Any, kwargs: dict[str, Any]) -> Any:
        kernels.append(clock.time(lambda: fn(**kwargs), device))
        return fn(**kwargs)

    run_padded(target, _copy(bound), problem, padded, out_shapes, call=timed)
    run_args = _copy(bound)
    padded_run = clock.time(lambda: run_padded(target, run_args, problem, padded, out_shapes, call=native_call), device)
    return OpSpeed(plain, sum(kernels), padded_run)
