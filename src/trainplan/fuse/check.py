"""An independent check of a grouping, written apart from the partitioner (it shares no code with it).

It works on names and edges only, as a user's GROUPS.json would be checked: every group non-empty,
disjoint, weakly connected, all members eligible; exactly one input op and one output op, the ones the
group names; contracting every group leaves a DAG (depth-first search, not the partitioner's sort); and
maximality: no two groups joined by an edge (singletons included) can be merged into one that keeps a
single input op, a single output op and an acyclic contraction (and, under a cap, at most ``max_ops`` ops).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def _contracted_has_cycle(label: dict[str, Any], edges: Sequence[tuple[str, str]]) -> bool:
    adj: dict[Any, set[Any]] = {}
    for a, b in edges:
        la, lb = label[a], label[b]
        if la != lb:
            adj.setdefault(la, set()).add(lb)
    colour: dict[Any, int] = {}
    for root in adj:
        if root in colour:
            continue
        colour[root] = 1
        stack = [(root, iter(adj.get(root, ())))]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
            elif colour.get(nxt) == 1:
                return True
            elif nxt not in colour:
                colour[nxt] = 1
                stack.append((nxt, iter(adj.get(nxt, ()))))
    return False


def _ends(members: set[str], preds: dict[str, list[str]], succs: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    ins = sorted(m for m in members if not preds[m] or not set(preds[m]) <= members)
    outs = sorted(m for m in members if not succs[m] or not set(succs[m]) <= members)
    return ins, outs


def _connected(members: set[str], preds: dict[str, list[str]], succs: dict[str, list[str]]) -> bool:
    start = next(iter(members))
    seen, stack = {start}, [start]
    while stack:
        u = stack.pop()
        for v in (*preds[u], *succs[u]):
            if v in members and v not in seen:
                seen.add(v)
                stack.append(v)
    return seen == members


def check_grouping(nodes: Iterable[str], edges: Sequence[tuple[str, str]], eligible: set[str],
                   groups: Sequence[dict[str, Any]], *, maximal: bool = True, cycle_check_merges: bool = True,
                   max_ops: int | None = None) -> list[str]:
    """Every violated property, as text (empty when the grouping is valid).

    ``groups`` are GROUPS.json entries (``nodes``, ``input``, ``output``). Eligible nodes in no group
    count as singletons for maximality. ``cycle_check_merges`` re-checks acyclicity for every merge
    candidate (quadratic; turn it off on large graphs, where SISO merges are checked alone). Under ``max_ops``
    (``trainplan.fuse.split``) a union of more ops is no merge candidate.
    """
    nodes = list(nodes)
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    succs: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        succs[a].append(b)
        preds[b].append(a)
    problems: list[str] = []
    owner: dict[str, int] = {}
    sets: list[set[str]] = []
    for k, g in enumerate(groups):
        members = set(g["nodes"])
        sets.append(members)
        if not members:
            problems.append(f"group {k} is empty")
            continue
        for m in members:
            if m in owner:
                problems.append(f"node {m} is in groups {owner[m]} and {k}")
            owner[m] = k
            if m not in eligible:
                problems.append(f"group {k}: member {m} is not supported")
        if not _connected(members, preds, succs):
            problems.append(f"group {k} is not connected")
        ins, outs = _ends(members, preds, succs)
        if ins != [g["input"]] or outs != [g["output"]]:
            problems.append(f"group {k}: input ops {ins} (says {g['input']}), output ops {outs} (says {g['output']})")
    for m in sorted(eligible - set(owner)):  # singletons
        owner[m] = len(sets)
        sets.append({m})
    label: dict[str, Any] = {n: owner.get(n, ("host", n)) for n in nodes}
    if _contracted_has_cycle(label, edges):
        problems.append("contracting the groups leaves a cycle")
    if maximal and not problems:
        tried: set[tuple[int, int]] = set()
        for a, b in edges:
            if a not in eligible or b not in eligible or owner[a] == owner[b]:
                continue
            pair = (owner[a], owner[b])
            if pair in tried:
                continue
            tried.add(pair)
            union = sets[pair[0]] | sets[pair[1]]
            if max_ops is not None and len(union) > max_ops:
                continue
            ins, outs = _ends(union, preds, succs)
            if len(ins) != 1 or len(outs) != 1:
                continue
            if cycle_check_merges:
                merged = {n: (pair[0] if lab == pair[1] else lab) for n, lab in label.items()}
                if _contracted_has_cycle(merged, edges):
                    continue
            problems.append(f"groups {pair[0]} and {pair[1]} (joined by {a} -> {b}) could be merged")
    return problems
