"""Per-model outcome of the overflow loop: final lists, denied ops, fp16 shares vs autocast, measured cost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from trainplan.export.trace import TracedStep
from trainplan.precision.assign import assign_precision, fp32_dtypes
from trainplan.precision.cost import fp16_shares, measure_steps, precision_table
from trainplan.precision.lists import autocast_policy
from trainplan.precision.policy import Policy


@dataclass
class OverflowSummary:
    """Summary document, per-op precision table (one column per policy) and all iterations' findings."""

    summary: dict[str, Any]
    precision: pd.DataFrame
    findings: pd.DataFrame


def findings_frame(iterations: list[dict[str, Any]]) -> pd.DataFrame:
    """All S1 records of all iterations, with an ``iteration`` column."""
    rows = [{"iteration": it["iteration"], **f} for it in iterations for f in it["findings"]]
    columns = ["iteration", "node", "op", "phase", "dtype", "bad_inputs", "bad_output", "is_root", "nan", "pos_inf", "neg_inf", "pos_sat", "neg_sat", "finite_min", "finite_max"]
    return pd.DataFrame(rows, columns=columns)


def injection_scores(injected: list[str], denied: list[str]) -> dict[str, Any]:
    """Precision and recall of the denied nodes against the injected roots (ground truth)."""
    hit = set(injected) & set(denied)
    return {
        "injected": injected,
        "injected_found": sorted(hit),
        "precision": len(hit) / len(denied) if denied else 1.0,
        "recall": len(hit) / len(injected) if injected else 1.0,
    }


def summarize(
    traced: TracedStep,
    flat: list[torch.Tensor],
    iterations: list[dict[str, Any]],
    start: Policy,
    final: Policy,
    flops: dict[str, float],
    *,
    injected: list[str] | None = None,
    repeats: int = 3,
    warmup: int = 1,
    emulate_matmul: bool = True,
) -> OverflowSummary:
    """Compare all-fp32, the starting policy, the final policy and CUDA autocast on the same graph.

    Shares are also given for autocast with the loop's roots denied (``autocast_denied``): plain
    autocast keeps every matmul in fp16 even where one overflows.
    """
    gm, loss = traced.gm, traced.loss_node
    policies = {
        "default": start,
        "final": final,
        "autocast": autocast_policy(),
        # autocast with the loop's roots denied too: the fair comparison when a root is a matmul
        "autocast_denied": autocast_policy().with_denied_nodes(list(final.deny_nodes)),
    }
    assignments = {name: assign_precision(gm, pol, loss) for name, pol in policies.items()}
    tables = {name: precision_table(gm, a, flops) for name, a in assignments.items()}
    precision = tables["final"].rename(columns={"dtype": "dtype_final", "list": "list_final"})
    for name in ("default", "autocast"):
        precision[f"dtype_{name}"] = tables[name].dtype.values
    measured = {"fp32": fp32_dtypes(gm), "default": assignments["default"].dtype, "final": assignments["final"].dtype}
    costs = measure_steps(gm, flat, measured, loss, repeats=repeats, warmup=warmup, emulate_matmul=emulate_matmul)
    last = iterations[-1]
    denied = [r for it in iterations for r in it["roots"]]
    denied_ops = precision.set_index("name").loc[denied, "op"].tolist() if denied else []
    summary = {
        "model": traced.model,
        "iterations": len(iterations),
        "converged": bool(last["clean"]),
        "stalled": bool(last["stalled"]),
        "denied_nodes": denied,
        "denied_ops": denied_ops,
        "roots_per_iteration": [it["roots"] for it in iterations],
        "final_loss": last["loss"],
        "inherent_fp32_bad_nodes": last["inherent"],
        "shares": {name: fp16_shares(t) for name, t in tables.items()},
        "cost": {name: c.to_dict() for name, c in costs.items()},
        "final_policy": final.to_dict(),
    }
    if injected:
        summary["injection"] = injection_scores(injected, denied)
    return OverflowSummary(summary, precision, findings_frame(iterations))
