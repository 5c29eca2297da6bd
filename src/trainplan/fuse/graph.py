"""The op graph the fusion partitioner works on: ops (nodes) joined by data edges, in a topological order."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainplan.fuse.errors import FuseError


@dataclass(frozen=True)
class TensorInfo:
    """Shape and dtype of one tensor an op reads or writes (dtype as torch prints it without 'torch.')."""

    shape: tuple[int, ...]
    dtype: str


@dataclass
class OpGraph:
    """A DAG of ops. Node ``i`` is ``names[i]`` running ``ops[i]``; ``preds``/``succs`` hold node indices.

    ``inputs``/``outputs`` are the tensors each op reads and writes (empty when unknown: library rules
    that look at shapes or dtypes then pass). ``order`` is a topological order of the node indices.
    """

    names: list[str]
    ops: list[str]
    preds: list[list[int]]
    succs: list[list[int]]
    inputs: list[list[TensorInfo]] = field(default_factory=list)
    outputs: list[list[TensorInfo]] = field(default_factory=list)
    order: list[int] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.names)

    def index(self) -> dict[str, int]:
        """Node name -> index."""
        return {name: i for i, name in enumerate(self.names)}

    def edges(self) -> Iterable[tuple[int, int]]:
        """Every edge (u, v) once."""
        for u, vs in enumerate(self.succs):
            for v in vs:
                yield u, v


def topological_order(names: Sequence[str], preds: Sequence[Sequence[int]], succs: Sequence[Sequence[int]]) -> list[int]:
    """Kahn's order (ties by index); a cycle raises FuseError naming a node on it."""
    indeg = [len(p) for p in preds]
    ready = [i for i in range(len(names)) if indeg[i] == 0]
    ready.reverse()
    order: list[int] = []
    while ready:
        u = ready.pop()
        order.append(u)
        for v in reversed(succs[u]):
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if len(order) < len(names):
        left = {i for i in range(len(names)) if indeg[i] > 0}
        node = _node_on_cycle(left, preds)
        raise FuseError(f"the graph has a cycle through node '{names[node]}'")
    return order


def _node_on_cycle(left: set[int], preds: Sequence[Sequence[int]]) -> int:
    """A node on a cycle among ``left``, the nodes Kahn's order never reached: each has a predecessor in
    ``left``, so walking predecessors inside ``left`` must repeat a node, which lies on a cycle."""
    node = min(left)
    seen: set[int] = set()
    while node not in seen:
        seen.add(node)
        node = next(p for p in preds[node] if p in left)
    return node


def build_graph(
    names: Sequence[str],
    ops: Sequence[str],
    edges: Iterable[tuple[str, str]],
    inputs: Sequence[Sequence[TensorInfo]] | None = None,
    outputs: Sequence[Sequence[TensorInfo]] | None = None,
) -> OpGraph:
    """An OpGraph from node names, their ops and (producer, consumer) name pairs.

    Raises FuseError naming the node for a duplicate name, a dangling edge, a self-loop or a cycle.
    """
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in index:
            raise FuseError(f"duplicate node id '{name}'")
        index[name] = i
    preds: list[list[int]] = [[] for _ in names]
    succs: list[list[int]] = [[] for _ in names]
    seen: set[tuple[int, int]] = set()
    for edge in edges:
        if len(edge) != 2:
            raise FuseError(f"edge {list(edge)!r} is not a [from, to] pair")
        a, b = edge
        for end in (a, b):
            if end not in index:
                raise FuseError(f"edge ['{a}', '{b}'] names node '{end}', which is not in the graph (dangling edge)")
        u, v = index[a], index[b]
        if u == v:
            raise FuseError(f"the graph has a cycle through node '{a}' (self-loop)")
        if (u, v) not in seen:
            seen.add((u, v))
            preds[v].append(u)
            succs[u].append(v)
    order = topological_order(names, preds, succs)
    n = len(names)
    return OpGraph(list(names), list(ops), preds, succs,
                   [list(x) for x in inputs] if inputs is not None else [[] for _ in range(n)],
                   [list(x) for x in outputs] if outputs is not None else [[] for _ in range(n)], order)


def _tensor_list(value: Any, node: str, key: str) -> list[TensorInfo]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise FuseError(f"node '{node}': '{key}' must be a list of {{shape, dtype}} objects")
    out = []
    for t in value:
        if not isinstance(t, dict) or "shape" not in t or "dtype" not in t:
            raise FuseError(f"node '{node}': every entry of '{key}' needs 'shape' and 'dtype'")
        shape = t["shape"]
        if not isinstance(shape, (list, tuple)) or not all(type(d) is int and d >= 0 for d in shape):
            raise FuseError(f"node '{node}': a shape in '{key}' must be a list of non-negative integers, got {shape!r}")
        out.append(TensorInfo(tuple(shape), str(t["dtype"]).removeprefix("torch.")))
    return out


def graph_from_dict(doc: Any) -> tuple[OpGraph, list[bool | None]]:
    """Parse the documented GRAPH.json form; returns the graph and each node's ``supported`` (None if absent)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise FuseError("graph document needs a 'nodes' list")
    names, ops, ins, outs, supported = [], [], [], [], []
    for k, node in enumerate(doc["nodes"]):
        if not isinstance(node, dict) or "id" not in node or "op" not in node:
            raise FuseError(f"node #{k} needs 'id' and 'op'")
        name = str(node["id"])
        names.append(name)
        ops.append(str(node["op"]))
        ins.append(_tensor_list(node.get("inputs"), name, "inputs"))
        outs.append(_tensor_list(node.get("outputs"), name, "outputs"))
        flag = node.get("supported")
        if flag is not None and not isinstance(flag, bool):
            raise FuseError(f"node '{name}': 'supported' must be true or false")
        supported.append(flag)
    edges = doc.get("edges", [])
    if not isinstance(edges, list):
        raise FuseError("graph document: 'edges' must be a list of [from, to] pairs")
    graph = build_graph(names, ops, [tuple(str(x) for x in e) if isinstance(e, list) else (e,) for e in edges], ins, outs)
    return graph, supported
