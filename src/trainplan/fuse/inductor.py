"""What the fusion measurements share about Inductor: running a compiled op in place of an fx submodule,
the submodule's inputs in a real run, its members minus a leading ``getitem``, and kernel launches counted
in Inductor's generated code."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: A kernel launch in the ``call`` function of Inductor's generated code: a generated C++/Triton kernel,
#: an extern kernel (aten mm, convolution ...) or an op Inductor falls back to.
_LAUNCH = re.compile(r"^\s+(?:\w+\s*=\s*)?(cpp_fused_\w+|triton_\w+|extern_kernels\.\w+|torch\.ops\.\w+\.\w+(?:\.\w+)?)"
                     r"(?:\.run)?\(", re.M)


def count_launches(code: Sequence[str]) -> int:
    """Kernel launches in Inductor's generated module(s): calls inside ``def call``."""
    total = 0
    for src in code:
        body = src.split("def call(", 1)[-1].split("\ndef ", 1)[0]
        total += len(_LAUNCH.findall(body))
    return total


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors of a (nested) list or tuple of results, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_of(v)]
    return []


def error_line(exc: Exception) -> str:
    """The exception's type and the first line of its message."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


class CallArgs(torch.fx.Interpreter):
    """Runs a graph once, recording the arguments every submodule call gets."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.args: dict[str, tuple[Any, ...]] = {}

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        self.args[str(target)] = args
        return super().call_module(target, args, kwargs)


class CompiledOp(torch.nn.Module):
    """A compiled callable in place of a fused submodule."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def fusible_members(nodes: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """The group's nodes minus a leading ``getitem`` of an op outside: the selected tensor becomes the
    fused op's input (a compiled graph takes tensors, not the tuple of a multi-output op)."""
    inside = set(nodes)
    return [n for n in nodes if not (n.target is operator.getitem and n.args[0] not in inside)]
