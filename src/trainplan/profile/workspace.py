"""Measure each op's workspace: the bytes a kernel allocates and frees again within its call (a convolution's
backward buffers, a reduction's partial sums), which a schedule must leave room for on top of the op's output.

An op's workspace is the most the allocator held during its call less what it holds at the call's end, the
op's outputs then counted and its temporaries gone; the values the op used last are freed after the call, as
compiled code frees them. On CUDA that is ``torch.cuda.max_memory_allocated`` after a reset less
``memory_allocated`` after the call; on the CPU the profiler's memory events inside a ``record_function`` range
per op (the CPU allocator keeps no peak)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from trainplan.profile.op_run import run_nodes
from trainplan.profiler_events import event_roots, memory_profile


def _cuda_workspaces(gm: torch.fx.GraphModule, inputs: list[torch.Tensor], device: torch.device) -> dict[str, int]:
    out: dict[str, int] = {}

    def around(node: torch.fx.Node, call: Callable[[], Any]) -> Any:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        value = call()
        torch.cuda.synchronize(device)
        out[node.name] = int(torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device))
        return value

    run_nodes(gm, inputs, around)
    return out


def _in_order(roots: list[Any]) -> Iterator[Any]:
    """Events of a profiler event tree, each before its children, siblings in order."""
    stack = list(reversed(roots))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children))


def _cpu_workspaces(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> dict[str, int]:
    from torch.profiler import record_function

    names = {node.name for node in gm.graph.nodes if node.op == "call_function"}

    def around(node: torch.fx.Node, call: Callable[[], Any]) -> Any:
        with record_function(node.name):
            return call()

    with memory_profile() as prof:
        run_nodes(gm, inputs, around)
    roots = event_roots(prof, "op workspaces not measured (taken as 0)")
    if roots is None:
        return {}
    out: dict[str, int] = {}
    for event in _in_order(roots):
        if event.name not in names or event.name in out:
            continue
        totals = [int(e.extra_fields.total_allocated) for e in _in_order(event.children)
                  if getattr(e.extra_fields, "total_allocated", None) is not None]
        out[event.name] = max(totals) - totals[-1] if totals else 0
    return out


def op_workspaces(gm: torch.fx.GraphModule, inputs: list[torch.Tensor], device: torch.device) -> dict[str, int]:
    """Each op's workspace in bytes (module docstring), by node name, from one op-by-op run of ``gm`` on
    ``inputs`` (on ``device``; run without autograd)."""
    with torch.no_grad():
        if device.type == "cuda":
            return _cuda_workspaces(gm, inputs, device)
        return _cpu_workspaces(gm, inputs)

