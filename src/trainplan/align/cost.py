"""Time of the padding copies themselves, ours vs naive, on an op's real input tensors (median of repeats)."""

from __future__ import annotations

from typing import Any

import torch

from trainplan.align.execute import naive_pad, pad_view
from trainplan.align.problem import Problem, naive_numel
from trainplan.align.speed import OpClock


def padding_times(bound: dict[str, Any], problem: Problem, padded: dict[str, int] | None, q: int,
                  repeats: int, warmup: int) -> tuple[float, float]:
    """(ours, naive) seconds to pad the op's half-precision input tensors that need a pad (0 when none does).

    ``padded`` None (no neutral layout) means ours is the naive padding.
    """
    clock, ours, naive = OpClock(repeats, warmup), 0.0, 0.0
    for t in problem.tensors:
        x = bound.get(t.role)
        if not isinstance(x, torch.Tensor):
            continue
        if naive_numel(t.shape, q) > t.numel():
            naive += clock.time(lambda: naive_pad(x, q), x.device)
        if padded is not None and any(a in padded for a in t.view):
            ours += clock.time(lambda: pad_view(x, t, problem, padded), x.device)
    return (naive if padded is None else ours), naive
