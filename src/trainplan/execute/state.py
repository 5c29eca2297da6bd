"""State a step changes in place, and how a recompute leaves it alone.

A training step updates some of its fixed inputs (parameters, buffers, batch) in place: batch norm's running
statistics and its step counter (``num_batches_tracked.add_(1)``). Eager runs each such op once per step;
a plan that recomputes the op would apply the update again (the running mean moves twice per step). A
rerun therefore hands the op copies of the state it writes, or skips an in-place update of it outright (its
result is the state as the first run left it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainplan.aten_ops import is_inplace
from trainplan.execute.layout import GraphLayout

#: ops that write arguments their schema does not mark as written: in training mode these batch norm
#: kernels update ``running_mean`` and ``running_var`` (arguments 3 and 4) in place
UNDECLARED_WRITES: dict[str, tuple[int, ...]] = {
    "aten.native_batch_norm.default": (3, 4),
    "aten.cudnn_batch_norm.default": (3, 4),
    "aten.miopen_batch_norm.default": (3, 4),
}


@dataclass(frozen=True)
class Rerun:
    """How to run ``node`` again: skip it (``skip``: an in-place update whose result is its first argument)
    or pass copies of the arguments at ``copies``."""

    skip: bool
    copies: tuple[int, ...]


def written_args(target: object) -> tuple[int, ...]:
    """Positions of the arguments ``target`` (an aten overload) writes in place."""
    if not isinstance(target, torch._ops.OpOverload):
        return ()
    declared = [i for i, a in enumerate(target._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    return tuple(sorted({*declared, *UNDECLARED_WRITES.get(str(target), ())}))


def rerun(node: torch.fx.Node, layout: GraphLayout) -> Rerun | None:
    """How ``node`` runs again without changing the step's fixed state a second time (None: as it is)."""
    state = tuple(i for i in written_args(node.target) if i < len(node.args) and isinstance(node.args[i], torch.fx.Node)
                  and layout.storage.get((node.args[i].name, -1)) in layout.fixed)
    if not state:
        return None
    return Rerun(skip=is_inplace(str(node.target)) and state[0] == 0, copies=state)
