"""Python kernels of custom ops that compiled plans call directly instead of through the dispatcher.

A ``torch.library`` custom op taking a list of tensors costs ~90 us a call in dispatch alone (measured on GPT-2
small's fused groups, 40 calls, medians of 30: the op 146.8 ms, its Python kernel 143.3 ms), 83 calls a step. A
plan runs without autograd (inside its loss Function's forward), where the op would only run that kernel: so the
compiled plan (:mod:`trainplan.execute.compile`) calls the kernel an op registered here, with the same result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_KERNELS: dict[Any, Callable[..., Any]] = {}


def register(op: Any, kernel: Callable[..., Any]) -> None:
    """Have compiled plans call ``kernel`` for ``op`` (an OpOverload whose only backend kernel it is)."""
    _KERNELS[op] = kernel


def kernel(target: Any) -> Any:
    """What a compiled plan calls for ``target``: its registered kernel, else ``target`` itself."""
    return _KERNELS.get(target, target)
