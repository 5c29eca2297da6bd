"""Per-model alignment: plan every half-precision op of a traced step, prove the plans by padded steps."""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import torch

from trainplan.align.graph import half_ops
from trainplan.align.plan import plan_op, totals
from trainplan.align.prove import proof_rows, run_padded_step
from trainplan.precision.interpreter import run_step

OP_COLUMNS = ["id", "op", "class", "strategy", "pad_value", "bytes", "pad_bytes", "naive_pad_bytes", "last_dim_pad_bytes", "pad_elements",
              "naive_pad_elements", "tensors", "tensors_aligned_before", "padded_shape", "note"]


def plan_model(gm: torch.fx.GraphModule, dtypes: dict[str, torch.dtype], granularity: int,
               half_dtypes: tuple[str, ...] = ("float16", "bfloat16"), matmul_rule: str = "dma",
               ) -> tuple[list[dict[str, Any]], pd.DataFrame]:
    """Plans of every op that runs in one of ``half_dtypes``, and a per-op table (columns ``OP_COLUMNS``)."""
    plans = [plan_op(spec, granularity, matmul_rule) for _, spec in half_ops(gm, dtypes) if spec.dtype in half_dtypes]
    rows = [{**{k: p[k] for k in OP_COLUMNS if k in p}, "padded_shape": str(p["padded_shape"]),
             "tensors": len(p["tensors"]), "tensors_aligned_before": sum(t["aligned_before"] for t in p["tensors"])}
            for p in plans]
    return plans, pd.DataFrame(rows, columns=OP_COLUMNS)


def model_summary(model: str, plans: list[dict[str, Any]], granularity: int, policy: str, matmul_rule: str = "dma") -> dict[str, Any]:
    """Totals of one model: bytes added by ours vs naive, share of tensors already aligned, fallbacks."""
    t = totals(plans)
    per_op_never_more = all(p["pad_bytes"] <= p["naive_pad_bytes"] for p in plans)
    return {"model": model, "granularity_bytes": granularity, "matmul_rule": matmul_rule, "policy": policy, **t,
            "never_more_than_naive_per_op": per_op_never_more,
            "fewer_than_naive_in_total": t["pad_bytes"] < t["naive_pad_bytes"]}


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Largest |a - b| and the largest |b| (both finite) of two tensors of the same shape."""
    d = (a.double() - b.double()).abs()
    d = torch.where(torch.isnan(d) & a.isnan() & b.isnan(), torch.zeros_like(d), d)
    return float(d.max()) if d.numel() else 0.0, float(b.double().abs().max()) if b.numel() else 0.0


def _grad_diffs(out: Any, ref: Any) -> tuple[float, list[tuple[float, float]], list[float]]:
    """Loss difference, per-gradient (max |diff|, max |ref|), per-gradient relative difference."""
    loss_diff, _ = _max_diff(out[0], ref[0])
    grads = [_max_diff(o, r) for o, r in zip(out[1:], ref[1:]) if isinstance(o, torch.Tensor)]
    rel = [d / m if m else (0.0 if d == 0 else float("inf")) for d, m in grads]
    return loss_diff, grads, rel


def prove_model(gm: torch.fx.GraphModule, flat: list[torch.Tensor], dtypes: dict[str, torch.dtype],
                granularity: int, label: str, timing: tuple[int, int] | None = None,
                fp32_ref: Any = None, matmul_rule: str = "dma") -> tuple[pd.DataFrame, dict[str, Any]]:
    """Padded step vs the unpadded step at the same precision: per-op proofs and loss/gradient differences.

    ``fp32_ref``: the all-fp32 step's outputs; the unpadded mixed-precision step's distance from it is the
    fp16 round-off scale the padded step's distance is compared with.
    """
    start = time.perf_counter()
    ref = run_step(gm, flat, dtypes)
    plain_s = time.perf_counter() - start
    start = time.perf_counter()
    out, interp = run_padded_step(gm, flat, dtypes, granularity, timing=timing, matmul_rule=matmul_rule)
    padded_s = time.perf_counter() - start
    loss_diff, grads, rel = _grad_diffs(out, ref)
    rows = pd.DataFrame(proof_rows(interp))
    rows.insert(0, "granularity_bytes", granularity)
    rows.insert(0, "run", label)
    step = {
        "run": label, "granularity_bytes": granularity, "matmul_rule": matmul_rule,
        "loss_unpadded": float(ref[0]), "loss_padded": float(out[0]), "loss_abs_diff": loss_diff,
        "gradients": len(grads), "gradients_identical": sum(d == 0 for d, _ in grads),
        "gradient_max_abs_diff": max((d for d, _ in grads), default=0.0),
        "gradient_max_rel_diff": max(rel, default=0.0),
        "padded_op_runs": interp.padded_ops,
        "distinct_ops": len(rows), "distinct_ops_padded": int(rows.padded.sum()) if len(rows) else 0,
        "distinct_ops_identical": int(rows.identical.sum()) if len(rows) else 0,
        "distinct_ops_within_tolerance": int(rows.within_tolerance.sum()) if len(rows) else 0,
        "naive_unproven": int((rows.strategy == "naive").sum()) if len(rows) else 0,
        "step_s_unpadded": plain_s, "step_s_padded": padded_s,
        "pad_s_ours": float((rows.pad_s_ours * rows.occurrences).sum()) if len(rows) else 0.0,
        "pad_s_naive": float((rows.pad_s_naive * rows.occurrences).sum()) if len(rows) else 0.0,
        "timed": timing is not None,
    }
    if fp32_ref is not None:
        f_loss, _, f_rel = _grad_diffs(ref, fp32_ref)
        step["fp16_vs_fp32_loss_abs_diff"] = f_loss
        step["fp16_vs_fp32_gradient_max_rel_diff"] = max(f_rel, default=0.0)
        # the padded step is as close to the unpadded one as fp16 rounding already moves it from fp32: gradients
        # within the unpadded step's own fp16-vs-fp32 relative difference, the loss within that difference or
        # fp16's unit round-off (2^-11) of the loss, whichever is larger (one scalar is a small sample)
        loss_bound = max(f_loss, 2.0**-11 * abs(float(ref[0])))
        step["loss_bound"] = loss_bound
        step["within_fp16_roundoff"] = bool(loss_diff <= loss_bound and step["gradient_max_rel_diff"] <= step["fp16_vs_fp32_gradient_max_rel_diff"])
    return rows, step
