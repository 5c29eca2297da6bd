"""Exact and baseline planners for a layout problem.

- ``dp``: dynamic programming (Viterbi) on a chain; exact.
- ``frontier``: exact DP over the graph's structure (variable elimination in topological order): a table of the
  best time for every layout assignment of the frontier (done nodes with a successor still to come); exact,
  size ``len(layouts) ** width``; refused above ``max_states``.
- ``cpsat``: OR-Tools CP-SAT on any DAG (per-edge layout-pair variables linked to node marginals); optimal
  or feasible with a bound within the time limit.
- ``backtrack``: the paper's Algorithm 1, depth-first assignment in topological order with early termination
  when the partial time plus the cheapest completion reaches the best found; reports nodes explored.
- ``all_<layout>`` and ``best_single``: one layout for the whole graph (TensorFlow's rule); nodes that cannot
  take it keep their cheapest allowed layout.
- ``exact``: ``dp`` on chains, ``frontier`` when its table fits ``max_states``, else ``cpsat``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from trainplan.layout.problem import LayoutProblem, LayoutProblemError

import numpy as np

METHODS = ("exact", "dp", "frontier", "cpsat", "backtrack", "best_single")
MAX_STATES = 1 << 22  # frontier DP table entries (float64): 32 MiB


@dataclass
class Plan:
    """A layout per node with its time (node costs + transforms on edges whose ends differ)."""

    layouts: dict[str, str]
    time: float
    status: str  # optimal | feasible
    bound: float
    method: str
    solve_time_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The plan in its file format."""
        return {"layouts": self.layouts, "time": self.time, "status": self.status, "bound": self.bound,
                "method": self.method, "solve_time_s": self.solve_time_s, **self.extra}


def plan_time(problem: LayoutProblem, layouts: dict[str, str]) -> float:
    """Total time of an assignment: every node's cost in its layout plus each differing edge's transform."""
    total = 0.0
    for n in problem.nodes:
        lay = layouts.get(n)
        if lay not in problem.cost[n]:
            raise LayoutProblemError(f"node '{n}': layout {lay!r} is not allowed (allowed: {problem.allowed(n)})")
        total += problem.cost[n][lay]
    for s, d in problem.edges:
        total += problem.edge_cost(s, d, layouts[s], layouts[d])
    return total


def _done(problem: LayoutProblem, layouts: dict[str, str], status: str, bound: float, method: str,
          start: float, **extra: Any) -> Plan:
    t = plan_time(problem, layouts)
    return Plan({n: layouts[n] for n in problem.nodes}, t, status, min(bound, t), method,
                time.perf_counter() - start, dict(extra))


def single_layout(problem: LayoutProblem, layout: str) -> Plan:
    """Every node in ``layout``; a node that cannot take it keeps its cheapest allowed layout."""
    start = time.perf_counter()
    layouts = {n: layout if layout in problem.cost[n] else min(problem.cost[n], key=problem.cost[n].get)
               for n in problem.nodes}
    return _done(problem, layouts, "feasible", 0.0, f"all_{layout}", start)


def best_single(problem: LayoutProblem) -> Plan:
    """The best of the single-layout plans (TensorFlow's one-layout-per-graph rule)."""
    start = time.perf_counter()
    best = min((single_layout(problem, lay) for lay in problem.layouts), key=lambda p: p.time)
    return _done(problem, best.layouts, "feasible", 0.0, "best_single", start, chosen=best.method)


def dp_chain(problem: LayoutProblem) -> Plan:
    """Exact Viterbi DP on a chain; raises LayoutProblemError if the graph is not a chain."""
    if not problem.is_chain():
        raise LayoutProblemError("method 'dp' needs a chain (each node at most one predecessor and successor)")
    start = time.perf_counter()
    order = problem.topo_order()
    best: dict[str, float] = dict(problem.cost[order[0]])
    back: list[dict[str, str]] = []
    for prev, node in zip(order, order[1:]):
        cur: dict[str, float] = {}
        arg: dict[str, str] = {}
        for b, c in problem.cost[node].items():
            a = min(best, key=lambda a: best[a] + problem.edge_cost(prev, node, a, b))
            cur[b] = best[a] + problem.edge_cost(prev, node, a, b) + c
            arg[b] = a
        best = cur
        back.append(arg)
    last = min(best, key=best.get)
    layouts = {order[-1]: last}
    for node, arg in zip(reversed(order[:-1]), reversed(back)):
        last = arg[last]
        layouts[node] = last
    return _done(problem, layouts, "optimal", best[min(best, key=best.get)], "dp", start)


def frontier_width(problem: LayoutProblem) -> int:
    """Largest frontier (done nodes with a successor still to come, plus the node being added) in topological
    order: the frontier DP's table has ``len(layouts) ** width`` entries."""
    order = problem.topo_order()
    pos = {n: i for i, n in enumerate(order)}
    last = {n: pos[n] for n in order}
    for s, d in problem.edges:
        last[s] = max(last[s], pos[d])
    return max(sum(1 for m in order[:i] if last[m] >= i) + 1 for i in range(len(order)))


def frontier_dp(problem: LayoutProblem, max_states: int = MAX_STATES) -> Plan:
    """Exact DP over the DAG: nodes join a cost table in topological order (one axis per frontier node, indexed
    by its allowed layouts) and leave it, minimised out with their argmin kept for decoding, once their last
    successor has joined. Raises LayoutProblemError when the table would exceed ``max_states`` entries."""
    start = time.perf_counter()
    order = problem.topo_order()
    pos = {n: i for i, n in enumerate(order)}
    last = {n: pos[n] for n in order}
    preds: dict[str, list[str]] = {n: [] for n in order}
    for s, d in problem.edges:
        last[s] = max(last[s], pos[d])
        preds[d].append(s)
    opts = {n: problem.allowed(n) for n in order}
    axes: list[str] = []  # frontier nodes, one table axis each
    table = np.zeros(())
    eliminated: list[tuple[str, list[str], np.ndarray]] = []  # node, axes left, argmin over them
    for i, v in enumerate(order):
        size = table.size * len(opts[v])
        if size > max_states:
            raise LayoutProblemError(f"frontier DP table at node '{v}' needs {size} entries (> {max_states})")
        table = table[..., None] + np.array([problem.cost[v][a] for a in opts[v]])
        axes.append(v)
        for p in preds[v]:
            mat = np.array([[problem.edge_cost(p, v, a, b) for b in opts[v]] for a in opts[p]])
            shape = [1] * len(axes)
            shape[axes.index(p)], shape[-1] = mat.shape
            table = table + mat.reshape(shape)
        for n in [n for n in axes if last[n] <= i]:
            k = axes.index(n)
            arg = np.argmin(table, axis=k)
            table = np.take_along_axis(table, np.expand_dims(arg, k), axis=k).squeeze(k)
            axes.pop(k)
            eliminated.append((n, list(axes), arg))
    layouts: dict[str, str] = {}
    for n, rest, arg in reversed(eliminated):
        idx = tuple(opts[m].index(layouts[m]) for m in rest)
        layouts[n] = opts[n][int(arg[idx])]
    return _done(problem, layouts, "optimal", float(table), "frontier", start,
                 frontier_width=frontier_width(problem))


def _scale(problem: LayoutProblem) -> float:
    """Integer scale for CP-SAT: the largest cost maps to about 1e9 units."""
    values = [t for c in problem.cost.values() for t in c.values()]
    values += [t for tab in problem.transform.values() for t in tab.values()]
    top = max(values + [1e-30])
    return 10.0 ** math.floor(math.log10(1e9 / top))


def cpsat(problem: LayoutProblem, time_limit: float = 10.0, workers: int = 2, seed: int = 0,
          hint: dict[str, str] | None = None) -> Plan:
    """CP-SAT: one-hot node layouts, per-edge pair variables whose marginals equal the end nodes' layouts.

    Costs are scaled to integers (``scale`` units per second, recorded); ``bound`` is CP-SAT's bound minus the
    worst rounding error, so it bounds the unscaled problem too."""
    from ortools.sat.python import cp_model

    start = time.perf_counter()
    scale = _scale(problem)
    m = cp_model.CpModel()
    x = {(n, a): m.NewBoolVar(f"x[{n},{a}]") for n in problem.nodes for a in problem.cost[n]}
    obj = []
    for n in problem.nodes:
        m.AddExactlyOne(x[n, a] for a in problem.cost[n])
        obj += [round(c * scale) * x[n, a] for a, c in problem.cost[n].items()]
    for s, d in problem.edges:
        pairs = {(a, b): m.NewBoolVar(f"y[{s},{d},{a},{b}]") for a in problem.cost[s] for b in problem.cost[d]}
        for a in problem.cost[s]:
            m.Add(sum(pairs[a, b] for b in problem.cost[d]) == x[s, a])
        for b in problem.cost[d]:
            m.Add(sum(pairs[a, b] for a in problem.cost[s]) == x[d, b])
        obj += [round(problem.edge_cost(s, d, a, b) * scale) * v for (a, b), v in pairs.items() if a != b]
    m.Minimize(sum(obj))
    if hint is None:
        hint = best_single(problem).layouts
    for (n, a), var in x.items():
        m.AddHint(var, hint.get(n) == a)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, float(time_limit))
    solver.parameters.num_workers = int(workers)
    solver.parameters.random_seed = int(seed)
    code = solver.Solve(m)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise LayoutProblemError(f"CP-SAT found no layout plan within {time_limit} s (status {solver.StatusName(code)})")
    layouts = {n: next(a for a in problem.cost[n] if solver.Value(x[n, a])) for n in problem.nodes}
    terms = len(problem.nodes) + len(problem.edges)
    bound = max(0.0, solver.BestObjectiveBound() / scale - 0.5 * terms / scale)
    status = "optimal" if code == cp_model.OPTIMAL else "feasible"
    return _done(problem, layouts, status, bound, "cpsat", start, scale=scale,
                 cpsat_objective=solver.ObjectiveValue(), cpsat_bound=solver.BestObjectiveBound())


def backtrack(problem: LayoutProblem, time_limit: float = 10.0) -> Plan:
    """The paper's Algorithm 1: depth-first over nodes in topological order, each layout in turn, terminating a
    branch early when its partial time plus the cheapest possible rest is no better than the best plan found.
    Optimal when it finishes within ``time_limit``; reports ``nodes_explored``."""
    start = time.perf_counter()
    order = problem.topo_order()
    preds: dict[str, list[str]] = {n: [] for n in order}
    for s, d in problem.edges:
        preds[d].append(s)
    rest = [0.0] * (len(order) + 1)  # cheapest node costs of order[i:], transforms at best 0
    for i in range(len(order) - 1, -1, -1):
        rest[i] = rest[i + 1] + min(problem.cost[order[i]].values())
    incumbent = best_single(problem)
    best = {"time": incumbent.time, "layouts": dict(incumbent.layouts)}
    chosen: dict[str, str] = {}
    explored = 0
    timed_out = False

    def visit(i: int, partial: float) -> None:
        nonlocal explored, timed_out
        if i == len(order):
            if partial < best["time"]:
                best["time"], best["layouts"] = partial, dict(chosen)
            return
        node = order[i]
        options = sorted(problem.cost[node].items(), key=lambda kv: kv[1])
        for lay, c in options:
            if timed_out or time.perf_counter() - start > time_limit:
                timed_out = True
                return
            explored += 1
            step = c + sum(problem.edge_cost(p, node, chosen[p], lay) for p in preds[node])
            if partial + step + rest[i + 1] >= best["time"]:
                continue  # early termination of this branch
            chosen[node] = lay
            visit(i + 1, partial + step)
            del chosen[node]

    visit(0, 0.0)
    status = "feasible" if timed_out else "optimal"
    bound = rest[0] if timed_out else best["time"]
    return _done(problem, best["layouts"], status, bound, "backtrack", start, nodes_explored=explored,
                 timed_out=timed_out)


def solve(problem: LayoutProblem, method: str = "exact", time_limit: float = 10.0, workers: int = 2,
          seed: int = 0) -> Plan:
    """Plan ``problem`` with ``method`` (see the module docstring)."""
    if method == "exact":
        if problem.is_chain():
            return dp_chain(problem)
        if len(problem.layouts) ** frontier_width(problem) <= MAX_STATES:
            return frontier_dp(problem)
        return cpsat(problem, time_limit, workers, seed)
    if method == "frontier":
        return frontier_dp(problem)
    if method == "dp":
        return dp_chain(problem)
    if method == "cpsat":
        return cpsat(problem, time_limit, workers, seed)
    if method == "backtrack":
        return backtrack(problem, time_limit)
    if method == "best_single":
        return best_single(problem)
    if method.startswith("all_") and method[4:] in problem.layouts:
        return single_layout(problem, method[4:])
    raise LayoutProblemError(f"unknown method '{method}' (known: {', '.join(METHODS)}, all_<layout>)")


def solve_all(problem: LayoutProblem, time_limit: float = 10.0, workers: int = 2, seed: int = 0) -> Plan:
    """The exact plan with every baseline (backtracking, each single layout, best single) under 'baselines'."""
    plan = solve(problem, "exact", time_limit, workers, seed)
    others = [backtrack(problem, time_limit), best_single(problem)]
    others += [single_layout(problem, lay) for lay in problem.layouts]
    plan.extra["baselines"] = {p.method: p.to_dict() for p in others}
    return plan
