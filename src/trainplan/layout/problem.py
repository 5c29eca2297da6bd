"""The layout problem: nodes with a time per allowed layout, edges with a transform time per layout pair.

File format (docs/layout.md)::

    {"layouts": ["nchw", "nhwc"],
     "nodes": [{"id": "c1", "cost": {"nchw": 1.2e-3, "nhwc": 0.9e-3}, "fixed": "nchw"?}],
     "edges": [{"src": "c1", "dst": "c2", "transform": {"nchw->nhwc": 1e-4, "nhwc->nchw": 1e-4}}]}

A node may list only some layouts in ``cost`` (those it can run in) or fix one with ``fixed``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from trainplan.errors import ArtifactError
from trainplan.io import read_json


class LayoutProblemError(ArtifactError):
    """A layout problem is malformed: the message names the node, edge or key (the CLI exits 2)."""


@dataclass
class LayoutProblem:
    """Nodes in a fixed order, each with its allowed layouts' times; edges with transform times."""

    layouts: list[str]
    nodes: list[str]
    cost: dict[str, dict[str, float]]
    edges: list[tuple[str, str]]
    transform: dict[tuple[str, str], dict[tuple[str, str], float]]
    meta: dict[str, Any] = field(default_factory=dict)

    def allowed(self, node: str) -> list[str]:
        """Layouts ``node`` may take, in the problem's layout order."""
        return [lay for lay in self.layouts if lay in self.cost[node]]

    def edge_cost(self, src: str, dst: str, a: str, b: str) -> float:
        """Transform time on edge src->dst when src is in layout ``a`` and dst in ``b`` (0 when equal)."""
        return 0.0 if a == b else self.transform[(src, dst)][(a, b)]

    def topo_order(self) -> list[str]:
        """Nodes in a topological order (Kahn, ties by file order)."""
        return _topo_order(self.nodes, self.edges)

    def is_chain(self) -> bool:
        """True when the graph is one path (every node at most one predecessor and one successor, connected)."""
        if len(self.edges) != len(self.nodes) - 1:
            return False
        ins = {n: 0 for n in self.nodes}
        outs = {n: 0 for n in self.nodes}
        for s, d in self.edges:
            outs[s] += 1
            ins[d] += 1
        return all(v <= 1 for v in ins.values()) and all(v <= 1 for v in outs.values())

    def to_dict(self) -> dict[str, Any]:
        """The problem in its file format."""
        return {
            "layouts": list(self.layouts),
            "nodes": [{"id": n, "cost": dict(self.cost[n])} for n in self.nodes],
            "edges": [
                {"src": s, "dst": d, "transform": {f"{a}->{b}": t for (a, b), t in self.transform[(s, d)].items()}}
                for s, d in self.edges
            ],
            **({"meta": self.meta} if self.meta else {}),
        }


def _topo_order(nodes: list[str], edges: list[tuple[str, str]]) -> list[str]:
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    indeg = {n: 0 for n in nodes}
    for s, d in edges:
        succ[s].append(d)
        indeg[d] += 1
    ready = [n for n in nodes if indeg[n] == 0]
    order: list[str] = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for m in succ[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    if len(order) != len(nodes):
        on_cycle = next(n for n in nodes if indeg[n] > 0)
        raise LayoutProblemError(f"graph has a cycle through node '{on_cycle}'")
    return order


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise LayoutProblemError(f"{where}: expected a finite non-negative number, got {value!r}")
    return float(value)


def problem_from_dict(data: Any, source: str = "problem") -> LayoutProblem:
    """Validate and build a problem; every error names the node, edge or key (and ``source``)."""
    if not isinstance(data, dict):
        raise LayoutProblemError(f"{source}: expected a JSON object with 'layouts', 'nodes', 'edges'")
    layouts = data.get("layouts")
    if not isinstance(layouts, list) or not layouts or not all(isinstance(x, str) for x in layouts):
        raise LayoutProblemError(f"{source}: key 'layouts' must be a non-empty list of names")
    if len(set(layouts)) != len(layouts):
        raise LayoutProblemError(f"{source}: key 'layouts' has duplicates")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise LayoutProblemError(f"{source}: key 'nodes' must be a non-empty list")
    nodes: list[str] = []
    cost: dict[str, dict[str, float]] = {}
    for i, raw in enumerate(raw_nodes):
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            raise LayoutProblemError(f"{source}: nodes[{i}] needs a string 'id'")
        nid = raw["id"]
        if nid in cost:
            raise LayoutProblemError(f"{source}: node '{nid}' is defined twice")
        costs = raw.get("cost")
        if not isinstance(costs, dict) or not costs:
            raise LayoutProblemError(f"{source}: node '{nid}' needs a 'cost' object {{layout: time}}")
        node_cost = {}
        for lay, t in costs.items():
            if lay not in layouts:
                raise LayoutProblemError(f"{source}: node '{nid}' has a cost for unknown layout '{lay}'")
            node_cost[lay] = _number(t, f"{source}: node '{nid}' cost '{lay}'")
        fixed = raw.get("fixed")
        if fixed is not None:
            if fixed not in node_cost:
                raise LayoutProblemError(f"{source}: node '{nid}' is fixed to '{fixed}' but has no cost for it")
            node_cost = {fixed: node_cost[fixed]}
        nodes.append(nid)
        cost[nid] = node_cost
    raw_edges = data.get("edges", [])
    if not isinstance(raw_edges, list):
        raise LayoutProblemError(f"{source}: key 'edges' must be a list")
    edges: list[tuple[str, str]] = []
    transform: dict[tuple[str, str], dict[tuple[str, str], float]] = {}
    for i, raw in enumerate(raw_edges):
        if not isinstance(raw, dict):
            raise LayoutProblemError(f"{source}: edges[{i}] must be an object")
        s, d = raw.get("src"), raw.get("dst")
        for end in (s, d):
            if end not in cost:
                raise LayoutProblemError(f"{source}: edges[{i}] refers to undefined node '{end}' (dangling edge)")
        if s == d:
            raise LayoutProblemError(f"{source}: graph has a cycle through node '{s}' (self-loop)")
        if (s, d) in transform:
            raise LayoutProblemError(f"{source}: edge '{s}'->'{d}' is listed twice")
        raw_t = raw.get("transform", {})
        if not isinstance(raw_t, dict):
            raise LayoutProblemError(f"{source}: edge '{s}'->'{d}' key 'transform' must be an object")
        table: dict[tuple[str, str], float] = {}
        for key, t in raw_t.items():
            a, _, b = str(key).partition("->")
            if a not in layouts or b not in layouts or a == b:
                raise LayoutProblemError(f"{source}: edge '{s}'->'{d}' has a bad transform key '{key}' (want 'a->b')")
            table[(a, b)] = _number(t, f"{source}: edge '{s}'->'{d}' transform '{key}'")
        for a in cost[s]:
            for b in cost[d]:
                if a != b and (a, b) not in table:
                    raise LayoutProblemError(f"{source}: edge '{s}'->'{d}' lacks transform '{a}->{b}'")
        edges.append((s, d))
        transform[(s, d)] = table
    problem = LayoutProblem(list(layouts), nodes, cost, edges, transform, dict(data.get("meta", {})))
    try:
        problem.topo_order()
    except LayoutProblemError as exc:
        raise LayoutProblemError(f"{source}: {exc}") from None
    return problem


def load_problem(path: str | os.PathLike[str]) -> LayoutProblem:
    """Read and validate a problem file; errors name the file and the node/edge/key."""
    return problem_from_dict(read_json(path), str(path))
