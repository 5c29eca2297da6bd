"""The traced training step: an aten-level fx graph and what its flat inputs are (made by ``export.trace``)."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch


@dataclass
class TracedStep:
    """An fx graph of one training step taking ``params + buffers + batch`` tensors as flat inputs.

    The graph returns ``(loss, *grads)``; a parameter that gets no gradient returns zeros.
    """

    model: str
    gm: torch.fx.GraphModule
    param_names: list[str]
    buffer_names: list[str]
    batch_names: list[str]
    loss_node: str

    def placeholder_kinds(self) -> list[str]:
        """Kind of each flat input, in placeholder order."""
        return (
            ["parameter"] * len(self.param_names)
            + ["buffer"] * len(self.buffer_names)
            + ["input"] * len(self.batch_names)
        )


def is_view_node(node: torch.fx.Node) -> bool:
    """A view op of a tensor, or an element of a view op's list (``getitem`` of ``split``)."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    if node.target is operator.getitem:
        return is_view_node(node.args[0])
    return isinstance(node.target, torch._ops.OpOverload) and node.target.is_view
