"""Plan one op's padding (ours, by class) next to naive every-dimension padding, and total a set of plans."""

from __future__ import annotations

import math
from typing import Any

from trainplan.align.classes import OpSpec, build_problem
from trainplan.align.problem import Problem, aligned, last_dim_numel, naive_numel, padded_numel, solve
from trainplan.align.units import element_size, quantum


def strategy_name(problem: Problem, padded: dict[str, int]) -> str:
    """'rows', 'columns', 'flat', 'channels+spatial' ... (axis kinds padded), or 'aligned' when none."""
    if not padded:
        return "aligned"
    return "+".join(dict.fromkeys(problem.axes[a].kind for a in padded))


def plan_op(spec: OpSpec, granularity: int, matmul_rule: str = "dma") -> dict[str, Any]:
    """The padding plan of one op: class, strategy, layout and values, padded vs naive elements and bytes.

    ``pad_elements`` / ``naive_pad_elements`` add up every half-precision tensor of the op that the spec
    gives (the primary one alone in a one-shape OPS.json entry). A class with no neutral layout for this
    op (``note``) falls back to naive padding, marked ``strategy: naive``. ``matmul_rule``: ``dma`` (the
    seed: rows or columns aligned) or ``tensor_core`` (every matmul dimension aligned).
    """
    elsize = element_size(spec.dtype, f"op '{spec.id}': ")
    q = quantum(granularity, elsize)
    problem = build_problem(spec, matmul_rule)
    solution = solve(problem, q)
    naive = sum(naive_numel(t.shape, q) - t.numel() for t in problem.tensors)
    last_dim = sum(last_dim_numel(t.shape, q) - t.numel() for t in problem.tensors)
    tensors = []
    if solution.padded is None:
        strategy, padded, pad = "naive", {}, naive
    else:
        padded, pad = solution.padded, solution.pad_elements
        strategy = "none (view)" if problem.cls == "view" else strategy_name(problem, padded)
    for t in problem.tensors:
        after = padded_numel(t, problem.axes, padded) if strategy != "naive" else naive_numel(t.shape, q)
        tensors.append({
            "role": t.role,
            "shape": list(t.shape),
            "view": [problem.axes[a].size for a in t.view],
            "padded_view": [padded.get(a, problem.axes[a].size) for a in t.view] if strategy != "naive"
            else [math.ceil(d / q) * q for d in t.shape],
            "pad_elements": after - t.numel(),
            "naive_pad_elements": naive_numel(t.shape, q) - t.numel(),
            "aligned_before": aligned(t, problem.axes, {}, q),
            # naive: every dimension a multiple of q, so every count, stride and block is
            "aligned_after": strategy == "naive" or aligned(t, problem.axes, padded, q),
            "pad_values": {problem.axes[a].kind: t.values.get(a, "0") for a in padded if a in t.view},
        })
    first = tensors[0] if tensors else None
    layout = {
        a: {"kind": problem.axes[a].kind, "size": problem.axes[a].size, "padded": size,
            "pad": size - problem.axes[a].size, "reason": problem.axes[a].reason}
        for a, size in padded.items()
    }
    pad_value = ", ".join(f"{k}: {v}" for k, v in first["pad_values"].items()) if first and first["pad_values"] else "0"
    return {
        "id": spec.id,
        "op": spec.op,
        "dtype": spec.dtype,
        "class": problem.cls,
        "strategy": strategy,
        "quantum": q,
        "shape": first["shape"] if first else None,
        "padded_shape": first["padded_view"] if first else None,
        "pad_layout": layout if strategy != "naive" else {"every dimension": {"pad_to_multiple_of": q}},
        "pad_elements": pad,
        "pad_bytes": pad * elsize,
        "pad_value": pad_value if strategy != "naive" else "0",
        "naive_pad_elements": naive,
        "naive_pad_bytes": naive * elsize,
        "last_dim_pad_bytes": last_dim * elsize,
        "bytes": sum(math.prod(t["shape"]) * elsize for t in tensors),
        "note": problem.note,
        "tensors": tensors,
    }


def totals(plans: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals of a plan list: bytes, padded bytes ours vs naive, ops already aligned, counts per class."""
    tensors = [t for p in plans for t in p["tensors"]]
    total = sum(p["bytes"] for p in plans)
    ours = sum(p["pad_bytes"] for p in plans)
    naive = sum(p["naive_pad_bytes"] for p in plans)
    last_dim = sum(p["last_dim_pad_bytes"] for p in plans)
    classes: dict[str, int] = {}
    for p in plans:
        classes[p["class"]] = classes.get(p["class"], 0) + 1
    return {
        "ops": len(plans),
        "tensors": len(tensors),
        "tensor_bytes": total,
        "pad_bytes": ours,
        "naive_pad_bytes": naive,
        "pad_share": ours / total if total else 0.0,
        "naive_pad_share": naive / total if total else 0.0,
        "last_dim_pad_bytes": last_dim,
        "last_dim_pad_share": last_dim / total if total else 0.0,
        "tensors_aligned_before": sum(t["aligned_before"] for t in tensors),
        "share_aligned_before": sum(t["aligned_before"] for t in tensors) / len(tensors) if tensors else 1.0,
        "tensors_aligned_after": sum(t["aligned_after"] for t in tensors),
        "naive_fallbacks": sum(p["strategy"] == "naive" for p in plans),
        "ops_per_class": dict(sorted(classes.items())),
    }
