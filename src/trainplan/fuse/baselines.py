"""Baselines on the same support mask: ONNX Runtime's wave grouping and torch.fx's CapabilityBasedPartitioner.

Both allow groups with several input and output ops; both keep the contracted graph acyclic.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Sequence

from trainplan.fuse.graph import OpGraph


def ort_wave_groups(graph: OpGraph, eligible: Sequence[bool]) -> list[list[int]]:
    """ONNX Runtime's ``CreateSupportedPartitionNodeGroups`` (core/providers/partitioning_utils.cc).

    Kahn's walk over the graph: a ready supported node joins the open group; a ready unsupported node
    that consumes an output of the open group (is on its border) waits for the next group; other ready
    unsupported nodes are processed at once. When nothing is ready, the group closes and the waiting
    nodes start the next wave. A group may be disconnected; it never makes a cycle when contracted.
    """
    indeg = [len(p) for p in graph.preds]
    ready = deque(u for u in graph.order if indeg[u] == 0)
    waiting: deque[int] = deque()
    groups: list[list[int]] = []
    group: list[int] = []
    border: set[int] = set()
    while ready or waiting:
        if not ready:
            if group:
                groups.append(group)
            group, border = [], set()
            ready, waiting = waiting, deque()
            continue
        u = ready.popleft()
        if not eligible[u] and u in border:
            waiting.append(u)
            continue
        if eligible[u]:
            group.append(u)
            border.discard(u)
        for v in graph.succs[u]:
            if eligible[u]:
                border.add(v)
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if group:
        groups.append(group)
    return groups


def _op(*args: object) -> None:
    """Stand-in target of every node of the fx graph handed to the partitioner."""


def fx_capability_groups(graph: OpGraph, eligible: Sequence[bool]) -> list[list[int]]:
    """torch.fx's ``CapabilityBasedPartitioner.propose_partitions`` on an fx graph of the same shape.

    Each op becomes a ``call_function`` node reading its predecessors; the operator support says yes
    exactly for the eligible ops. Single-node partitions are kept, as ours are.
    """
    import torch.fx
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    fx = torch.fx.Graph()
    nodes: dict[int, torch.fx.Node] = {}
    index: dict[torch.fx.Node, int] = {}
    for u in graph.order:
        node = fx.call_function(_op, tuple(nodes[p] for p in graph.preds[u]))
        nodes[u], index[node] = node, u
    fx.output(tuple(nodes[u] for u in range(graph.n) if not graph.succs[u]))

    class Support(OperatorSupportBase):
        def is_node_supported(self, submodules, node):  # type: ignore[no-untyped-def]
            return node in index and eligible[index[node]]

    gm = torch.fx.GraphModule(torch.nn.Module(), fx)
    parts = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True).propose_partitions()
    position = {u: k for k, u in enumerate(graph.order)}
    return [sorted((index[n] for n in p.nodes), key=position.__getitem__) for p in parts]
