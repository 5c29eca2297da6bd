"""An op's padding problem (named axes shared by its tensors, one alignment rule per tensor) and its solution.

Each op class (``classes.py``) views every half-precision tensor of an op as a row-major list of named
axes (a view: a reshape of the contiguous tensor, e.g. ``[n, m]`` with ``m = c*h*w``). A tensor is
aligned when its rule holds at quantum q (elements per granularity):

* ``flat`` (seed s1, 1-D): the element count is a multiple of q;
* ``either`` (seed s2, 2-D n x m): the row count or the row length is a multiple of q
  (``m`` or ``n`` even at g = 4);
* ``all`` (seed s3, 3-D n, c, h*w): every named axis (c and h*w) is a multiple of q.

Padding an axis rounds it up to a multiple of q in every tensor that has it, with a pad value chosen
per tensor so the op's result on the real elements is unchanged. The solver tries every set of
padable axes and keeps the one with the fewest padded elements (ties: fewer axes, then the class's
order, rows before columns).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from trainplan.align.units import round_up

FLAT, EITHER, ALL = "flat", "either", "all"


@dataclass(frozen=True)
class Axis:
    """A named dimension of the op's views. ``kind``: rows, columns, channels, spatial, flat, batch ...

    ``padable``: the class knows a neutral way to pad it; ``reason`` says why the pad is neutral.
    """

    name: str
    size: int
    kind: str
    padable: bool = True
    reason: str = ""


@dataclass(frozen=True)
class TensorView:
    """One half-precision tensor of the op: its real shape, its view as axis names, its rule, its pad values.

    ``groups`` (for ``either``: the row group and the column group of axes; for ``all``: one axis per
    group) name which axes the rule checks. ``values``: pad value per padable axis of this tensor
    (``"0"``, ``"-inf"``, ...) with ``masked`` axes marked by the value ``"0 (masked)"``.
    """

    role: str
    shape: tuple[int, ...]
    view: tuple[str, ...]
    rule: str
    groups: tuple[tuple[str, ...], ...] = ()
    values: dict[str, str] = field(default_factory=dict)

    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Problem:
    """Axes, tensors and class of one op; ``note``: why a class has no neutral padding (then naive)."""

    op: str
    cls: str
    axes: dict[str, Axis]
    tensors: list[TensorView]
    note: str = ""


def _size(axes: dict[str, Axis], names: tuple[str, ...], padded: dict[str, int]) -> int:
    return math.prod(padded.get(a, axes[a].size) for a in names)


def aligned(t: TensorView, axes: dict[str, Axis], padded: dict[str, int], q: int) -> bool:
    """Whether tensor ``t`` meets its rule with axes resized as in ``padded``."""
    if t.rule == FLAT:
        return _size(axes, t.view, padded) % q == 0
    checks = [_size(axes, g, padded) % q == 0 for g in t.groups]
    return any(checks) if t.rule == EITHER else all(checks)


def padded_numel(t: TensorView, axes: dict[str, Axis], padded: dict[str, int]) -> int:
    """Elements of ``t`` after padding."""
    return _size(axes, t.view, padded)


def naive_numel(shape: tuple[int, ...], q: int) -> int:
    """Elements of a tensor after naive padding: every dimension rounded up to a multiple of q."""
    return math.prod(round_up(d, q) for d in shape) if shape else (round_up(1, q))


@dataclass(frozen=True)
class Solution:
    """Chosen padded sizes (axis -> size) or None when no neutral padding aligns every tensor."""

    padded: dict[str, int] | None
    pad_elements: int


def solve(problem: Problem, q: int) -> Solution:
    """Fewest padded elements over every set of padable axes (each rounded up to a multiple of q)."""
    used = {a for t in problem.tensors for a in t.view}
    candidates = [a for a in problem.axes if a in used and problem.axes[a].padable and problem.axes[a].size % q]
    best: tuple[int, int, tuple[int, ...]] | None = None
    best_padded: dict[str, int] | None = None
    order = {a: i for i, a in enumerate(problem.axes)}
    for k in range(len(candidates) + 1):
        for subset in itertools.combinations(candidates, k):
            padded = {a: round_up(problem.axes[a].size, q) for a in subset}
            if not all(aligned(t, problem.axes, padded, q) for t in problem.tensors):
                continue
            cost = sum(padded_numel(t, problem.axes, padded) - t.numel() for t in problem.tensors)
            key = (cost, k, tuple(order[a] for a in subset))
            if best is None or key < best:
                best, best_padded = key, padded
    if best is None:
        return Solution(None, 0)
    return Solution(best_padded, best[0])
