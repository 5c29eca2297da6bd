"""Study-level table and figure of the overflow loop (one row / bar group per model)."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from trainplan.plots import nothing_to_draw, save_figure  # noqa: E402


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
    if table.empty:
        nothing_to_draw(path, "fp16 overflow loop", "no model in study.overflow")
        return
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
    save_figure(fig, path)


def plot_model_overflow(summary: dict[str, Any], findings: pd.DataFrame, precision: pd.DataFrame, path: str) -> None:
    """One model's loop: ops with a bad (inf/NaN/65504) output and roots denied per pass; the final
    allow/infer/deny lists by op count and by the precision each op ends up in, with FLOP shares."""
    title = f"{summary['model']}: fp16 overflow loop, {summary['iterations']} pass(es), " + (
        "converged" if summary["converged"] else "NOT converged")
    if precision.empty:
        nothing_to_draw(path, title, "the precision table has no op")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 4.5))
    passes = range(summary["iterations"])
    bad = findings[findings.bad_output] if not findings.empty else findings
    for j, phase in enumerate(("forward", "backward")):
        counts = [int(((bad.iteration == i) & (bad.phase == phase)).sum()) if len(bad) else 0 for i in passes]
        ax1.bar([i + (j - 0.5) * 0.4 for i in passes], counts, 0.4, label=f"{phase} ops with a bad output")
    for i, roots in enumerate(summary["roots_per_iteration"]):
        ax1.annotate("roots: " + (", ".join(roots[:4]) + (" ..." if len(roots) > 4 else "") if roots else "none (clean)"),
                     (i, 0), xytext=(0, 4), textcoords="offset points", ha="center", fontsize=8, rotation=90
                     if len(roots) > 2 else 0, va="bottom")
    ax1.set_xticks(list(passes), [f"pass {i}" for i in passes])
    ax1.set_ylabel("ops (this pass)")
    ax1.set_title("S1 ops that output inf/NaN/65504, S2 roots (denied by S3)", fontsize=10)
    ax1.legend(fontsize=8)
    floating = precision[precision.floating]
    lists = ["allow", "infer", "deny"]
    total = max(floating.flops.sum(), 1.0)
    for j, dtype in enumerate(("float16", "float32")):
        part = floating[floating.dtype_final == dtype]
        counts = [int((part.list_final == name).sum()) for name in lists]
        shares = [part.flops[part.list_final == name].sum() / total for name in lists]
        bars = ax2.bar([i + (j - 0.5) * 0.4 for i in range(3)], counts, 0.4, label=f"runs in {dtype}")
        for bar, share in zip(bars, shares):
            ax2.annotate(f"{share:.1%} FLOPs", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                         ha="center", va="bottom", fontsize=8)
    ax2.set_xticks(range(3), lists)
    ax2.set_ylabel("floating-point ops of the step")
    denied = summary["denied_nodes"]
    ax2.set_title(f"final lists; denied by the loop: {', '.join(denied[:6]) or 'none'}"
                  + (f" (+{len(denied) - 6})" if len(denied) > 6 else ""), fontsize=10)
    ax2.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    save_figure(fig, path)
