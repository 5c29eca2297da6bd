"""Study-level table and figure of the overflow loop (one row / bar group per model)."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from trainplan.io import atomic_path


def study_table(summaries: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per model: iterations, denied ops, fp16 shares (final / default / autocast), cost ratios."""
    rows = []
    for s in summaries:
        sh, cost = s["shares"], s["cost"]
        rows.append(
            {
                "model": s["model"],
                "iterations": s["iterations"],
                "converged": s["converged"],
                "n_denied": len(s["denied_nodes"]),
                "denied_ops": ", ".join(f"{n} ({o})" for n, o in zip(s["denied_nodes"], s["denied_ops"])),
                "fp16_op_fraction_final": sh["final"]["fp16_op_fraction"],
                "fp16_flop_share_final": sh["final"]["fp16_flop_share"],
                "fp16_flop_share_default": sh["default"]["fp16_flop_share"],
                "fp16_flop_share_autocast": sh["autocast"]["fp16_flop_share"],
                "fp16_flop_share_autocast_denied": sh["autocast_denied"]["fp16_flop_share"],
                "step_s_fp32": cost["fp32"]["step_time_s"],
                "step_s_default": cost["default"]["step_time_s"],
                "step_s_final": cost["final"]["step_time_s"],
                "saved_bytes_fp32": cost["fp32"]["saved_for_backward_bytes"],
                "saved_bytes_final": cost["final"]["saved_for_backward_bytes"],
                "activation_peak_bytes_fp32": cost["fp32"]["activation_peak_bytes"],
                "activation_peak_bytes_final": cost["final"]["activation_peak_bytes"],
                "injection_precision": s.get("injection", {}).get("precision"),
                "injection_recall": s.get("injection", {}).get("recall"),
            }
        )
    return pd.DataFrame(rows)


def plot_study(table: pd.DataFrame, path: str) -> None:
    """FLOP share left in fp32 (default, final, autocast), step time and saved activations per model."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    x = range(len(table))
    width = 0.2
    panels = [
        (
            axes[0],
            ["fp16_flop_share_default", "fp16_flop_share_final", "fp16_flop_share_autocast", "fp16_flop_share_autocast_denied"],
            ["default", "final", "CUDA autocast", "autocast + loop's roots denied"],
            None,
            "FLOP share left in fp32 (1 - fp16 share)",
        ),
        (axes[1], ["step_s_fp32", "step_s_default", "step_s_final"], ["all fp32", "default", "final"], 1.0, "step time on CPU (s)"),
        (axes[2], ["saved_bytes_fp32", "saved_bytes_final"], ["all fp32", "final"], 2**-20, "activations held for backward (MiB)"),
    ]
    for ax, cols, labels, scale, ylabel in panels:
        for k, (col, label) in enumerate(zip(cols, labels)):
            values = 1.0 - table[col] if scale is None else table[col] * scale
            ax.bar([i + (k - (len(cols) - 1) / 2) * width for i in x], values, width=width, label=label)
        ax.set_xticks(list(x), [f"{m}\n{it} iter, {n} denied" for m, it, n in zip(table.model, table.iterations, table.n_denied)])
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    fig.suptitle("fp16 overflow loop (S1 detect, S2 root cause, S3 deny) per model")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
