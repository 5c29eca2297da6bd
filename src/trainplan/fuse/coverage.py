"""How much of the supported work a grouping covers, and what each group keeps out of memory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from trainplan.aten_ops import is_inplace
from trainplan.fuse.graph import OpGraph


def coverage(groups: Sequence[Sequence[int]], eligible: Sequence[bool], time_s: np.ndarray) -> dict[str, Any]:
    """Group counts and the share of eligible ops / of their measured time inside groups of >= 2 ops
    (time coverage NaN when the eligible ops have no positive measured time)."""
    multi = [g for g in groups if len(g) >= 2]
    inside = [u for g in multi for u in g]
    elig = np.flatnonzero(np.asarray(eligible, dtype=bool))
    total_time = float(time_s[elig].sum())
    return {
        "groups": len(groups), "groups_ge2": len(multi), "largest": max((len(g) for g in groups), default=0),
        "ops_in_groups_ge2": len(inside), "coverage_ops": len(inside) / len(elig) if len(elig) else 0.0,
        # NaN without measured times (a graph with no profile)
        "coverage_time": float(time_s[inside].sum()) / total_time if total_time > 0 else float("nan"),
    }


def internal_bytes(graph: OpGraph, members: set[int], alloc_bytes: np.ndarray, is_view: np.ndarray) -> int:
    """Bytes the members allocate that nothing outside reads: written by the unfused ops, not needed by a
    fused kernel. A storage counts only when neither its producer nor any member view of it has a
    successor outside the group (views alias the storage they read)."""
    total = 0
    for u in members:
        if alloc_bytes[u] <= 0 or is_view[u]:
            continue
        stack, seen, escapes = [u], {u}, False
        while stack and not escapes:
            x = stack.pop()
            for s in graph.succs[x]:
                if s not in members:
                    escapes = True
                    break
                if is_view[s] and s not in seen:
                    seen.add(s)
                    stack.append(s)
        total += 0 if escapes else int(alloc_bytes[u])
    return total


def group_table(graph: OpGraph, groups: Sequence[Sequence[int]], ends: Sequence[tuple[int, int]],
                nodes: pd.DataFrame, time_s: np.ndarray) -> pd.DataFrame:
    """One row per group: ops, ends, phase, measured time, kernels (non-view and in-place ops), internal bytes."""
    alloc = nodes["alloc_bytes"].to_numpy()
    view = nodes["is_view"].to_numpy(dtype=bool)
    # an in-place op allocates nothing and aliases its input (is_view in the export) but is a kernel
    kernel = ~view | nodes["op"].fillna("").map(is_inplace).to_numpy(dtype=bool)
    phase = nodes["phase"].to_numpy()
    module = nodes["module"].to_numpy()
    rows = []
    for k, (g, (i, o)) in enumerate(zip(groups, ends)):
        phases = sorted({phase[u] for u in g})
        rows.append({
            "group": k, "n_ops": len(g), "input": graph.names[i], "output": graph.names[o],
            "phase": phases[0] if len(phases) == 1 else "mixed", "module": module[i],
            "time_s": float(time_s[list(g)].sum()), "kernels": int(kernel[list(g)].sum()),
            "alloc_bytes": int(alloc[list(g)].sum()), "internal_bytes": internal_bytes(graph, set(g), alloc, view),
            "ops": " ".join(graph.ops[u] for u in g),
        })
    return pd.DataFrame(rows)
