"""The optimizer's update of one parameter as an op of the traced step: ``trainplan::optimizer_step``.

The op is a ``torch.library`` custom op that writes its parameter in place (so the step's tables, problem and
executor see what it reads and writes) and applies the update the caller bound with :func:`updates_bound`:
the plan places it in backward, where its gradient is complete and its parameter read for the last time, and
the gradient is freed once it has run (the optimizer-in-backward technique).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

Update = Callable[[int, torch.Tensor], None]  # (parameter index in the step's parameter order, its gradient)

_BOUND: ContextVar[Update | None] = ContextVar("trainplan_optimizer_step", default=None)


@torch.library.custom_op("trainplan::optimizer_step", mutates_args=("param",))
def optimizer_step(param: torch.Tensor, grad: torch.Tensor, index: int) -> None:
    """Update parameter ``index`` (``param``) from ``grad`` with the bound update."""
    update = _BOUND.get()
    if update is None:
        raise RuntimeError("trainplan::optimizer_step ran with no update bound: run the step inside "
                           "trainplan.loop.update_op.updates_bound(update)")
    update(index, grad)


@optimizer_step.register_fake
def _optimizer_step_fake(param: torch.Tensor, grad: torch.Tensor, index: int) -> None:
    return None


@contextmanager
def updates_bound(update: Update) -> Iterator[None]:
    """Run the steps inside with ``update`` applying each ``optimizer_step`` op."""
    token = _BOUND.set(update)
    try:
        yield
    finally:
        _BOUND.reset(token)
