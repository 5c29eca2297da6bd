"""Study-level table and figure of the alignment stage (one row / bar group per model)."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from trainplan.io import atomic_path


def study_table(summaries: list[dict[str, Any]], steps: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per model: bytes padded ours vs naive, tensors already aligned, padding time, proof outcome."""
    proofs = {s["model"]: s for s in steps}
    rows = []
    for s in summaries:
        runs = proofs.get(s["model"], {}).get("steps", [])
        timed = [r for r in runs if r.get("timed")]
        rows.append({
            "model": s["model"], "granularity_bytes": s["granularity_bytes"], "ops": s["ops"], "tensors": s["tensors"],
            "tensor_bytes": s["tensor_bytes"], "pad_bytes": s["pad_bytes"], "naive_pad_bytes": s["naive_pad_bytes"],
            "pad_share": s["pad_share"], "naive_pad_share": s["naive_pad_share"],
            "share_aligned_before": s["share_aligned_before"], "naive_fallbacks": s["naive_fallbacks"],
            "never_more_than_naive_per_op": s["never_more_than_naive_per_op"],
            "pad_s_ours": timed[0]["pad_s_ours"] if timed else None,
            "pad_s_naive": timed[0]["pad_s_naive"] if timed else None,
            "proof_runs": len(runs),
            "proof_distinct_ops": sum(r["distinct_ops"] for r in runs),
            "proof_padded_ops": sum(r["distinct_ops_padded"] for r in runs),
            "proof_identical": sum(r["distinct_ops_identical"] for r in runs),
            "proof_within_tolerance": sum(r["distinct_ops_within_tolerance"] for r in runs),
            "steps_within_fp16_roundoff": sum(bool(r.get("within_fp16_roundoff")) for r in runs),
            "max_loss_abs_diff": max((r["loss_abs_diff"] for r in runs), default=None),
            "max_gradient_rel_diff": max((r["gradient_max_rel_diff"] for r in runs), default=None),
        })
    return pd.DataFrame(rows)


def plot_study(table: pd.DataFrame, path: str) -> None:
    """Bytes added (share of half-precision bytes), padding-copy time, and proof outcome, ours vs naive."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    x = range(len(table))
    w = 0.38
    ax = axes[0]
    ax.bar([i - w / 2 for i in x], 100 * table.pad_share, w, label="ours (per op class)")
    ax.bar([i + w / 2 for i in x], 100 * table.naive_pad_share, w, label="naive (every dimension)")
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_ylabel("bytes added, % of fp16 tensor bytes")
    ax.set_title(f"padding at g = {int(table.granularity_bytes.iloc[0])} B")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.bar([i - w / 2 for i in x], 1e3 * table.pad_s_ours.fillna(0), w, label="ours")
    ax.bar([i + w / 2 for i in x], 1e3 * table.pad_s_naive.fillna(0), w, label="naive")
    ax.set_ylabel("padding copies per step, ms (CPU, under load)")
    ax.set_title("time of the padding copies")
    ax.legend(fontsize=8)
    ax = axes[2]
    ax.bar([i - w / 2 for i in x], table.proof_identical, w, label="bit-identical")
    ax.bar([i + w / 2 for i in x], table.proof_within_tolerance, w, label="within fp16 round-off")
    ax.plot(list(x), table.proof_distinct_ops, "k_", markersize=20, label="distinct ops run")
    ax.set_ylabel("distinct (op, shape) over all proof runs")
    ax.set_title("padded vs unpadded execution")
    ax.legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(list(x), table.model, rotation=20)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
