"""Figures for the report (matplotlib, headless)."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from trainplan.io import atomic_path  # noqa: E402

PHASE_COLORS = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green"}


def _save(fig: Any, path: str) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_op_times(ops: pd.DataFrame, summary: dict[str, Any], path: str, top: int = 15) -> None:
    """Per-op time along the execution order, and the ops that take the most time."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    for phase, part in ops.groupby("phase"):
        ax1.bar(part.node_id, part.time_s * 1e3, width=1.0, color=PHASE_COLORS.get(str(phase), "gray"), label=str(phase))
    ax1.set_xlabel("op index (execution order)")
    ax1.set_ylabel("median time (ms)")
    ax1.set_title(
        f"{summary['model']} on {summary['device']}: per-op sum {summary['op_sum_s']:.3f} s, "
        f"whole step {summary['step_time_s']:.3f} s (ratio {summary['op_sum_over_step']:.2f})"
    )
    ax1.legend()
    by_op = ops.assign(kind=ops.op.str.split(".").str[1]).groupby("kind").time_s.sum().nlargest(top)
    ax2.barh(by_op.index[::-1], by_op.to_numpy()[::-1] * 1e3, color="tab:gray")
    ax2.set_xlabel("total time (ms)")
    ax2.set_title("time by aten op")
    _save(fig, path)


def plot_memory(memory: pd.DataFrame, summary: dict[str, Any], path: str) -> None:
    """Live bytes while each op runs (no recompute, free after last use), above the fixed bytes."""
    fig, ax = plt.subplots(figsize=(11, 4))
    mib = 2**20
    for phase, part in memory.groupby("phase"):
        ax.fill_between(part.node_id, (summary["fixed_bytes"] + part.live_bytes) / mib, summary["fixed_bytes"] / mib,
                        step="mid", color=PHASE_COLORS.get(str(phase), "gray"), alpha=0.6, label=f"{phase} activations")
    ax.axhline(summary["fixed_bytes"] / mib, color="black", lw=0.8, label="parameters + buffers + inputs")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("op index (execution order)")
    ax.set_ylabel("MiB")
    ax.set_title(f"{summary['model']}: peak {summary['peak_bytes'] / mib:.0f} MiB at {summary['peak_node']}")
    ax.legend(loc="upper left")
    _save(fig, path)


def plot_schedule_comparison(table: pd.DataFrame, path: str) -> None:
    """Step-time overhead over no recompute, per method, against the memory budget (sum over stages)."""
    within = table.status.isin(["optimal", "feasible"]) & (table.budget_bytes <= table.requested_budget_bytes)
    table = table.assign(time_s=table.time_s.where(within | (table.method == "no_recompute")))
    per_budget = (
        table.groupby(["budget_fraction", "method"])
        .agg(time_s=("time_s", lambda s: s.sum(min_count=len(s))), status=("status", lambda s: ",".join(sorted(set(s)))))
        .reset_index()
    )
    base = per_budget[per_budget.method == "no_recompute"].set_index("budget_fraction").time_s
    fig, ax = plt.subplots(figsize=(7, 4))
    for method, part in per_budget.groupby("method"):
        if method == "no_recompute":
            continue
        ok = part.time_s.notna()
        overhead = part.time_s[ok].to_numpy() / base.loc[part.budget_fraction[ok]].to_numpy() - 1.0
        ax.plot(part.budget_fraction[ok], overhead * 100, marker="o", label=str(method))
    ax.set_xlabel("memory budget (fraction of the no-recompute activation peak)")
    ax.set_ylabel("step-time overhead over no recompute (%)")
    ax.invert_xaxis()
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_title(f"{table.model.iloc[0]}, k={table.k.iloc[0]}: methods that found a schedule within the budget")
    ax.legend()
    _save(fig, path)
