"""Run a traced step's graph op by op, freeing each value after its last use as compiled fx code does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx.node import map_arg


def values_freed_after(graph: torch.fx.Graph) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """For each node, the values whose last use it is (freed right after it, as compiled fx code does)."""
    seen: set[torch.fx.Node] = set()
    out: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in reversed(graph.nodes):
        for inp in node.all_input_nodes:
            if inp not in seen:
                seen.add(inp)
                out.setdefault(node, []).append(inp)
    return out


def run_nodes(gm: torch.fx.GraphModule, inputs: list[torch.Tensor],
              around: Callable[[torch.fx.Node, Callable[[], Any]], Any]) -> None:
    """Run the graph op by op, each call through ``around(node, call)`` (which returns the call's value); each
    value freed after the call that uses it last."""
    env: dict[torch.fx.Node, Any] = {}
    feed = iter(inputs)
    freed_after = values_freed_after(gm.graph)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(feed)
        elif node.op == "get_attr":
            env[node] = getattr(gm, str(node.target))
        elif node.op == "call_function":
            args, kwargs = map_arg((node.args, node.kwargs), env.__getitem__)
            env[node] = around(node, lambda: node.target(*args, **kwargs))
            del args, kwargs
        for value in freed_after.get(node, []):
            env.pop(value, None)
