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


def schedule_points(table: pd.DataFrame) -> pd.DataFrame:
    """One point per requested budget and method (stages summed): the step-time overhead over no recompute,
    the memory used (the largest stage's peak above its fixed bytes, as a fraction of its no-recompute
    activation peak), whether every stage met the requested budget, and the statuses. A method with a stage
    without a schedule has no point (its statuses say why)."""
    rows = []
    base = table[table.method == "no_recompute"].groupby("budget_fraction").time_s.sum()
    for (fraction, method), part in table.groupby(["budget_fraction", "method"]):
        statuses = ",".join(sorted(set(part.status)))
        has_time = part.time_s.notna().all()
        within = part.status.isin(["optimal", "feasible"]).all() and (part.budget_bytes <= part.requested_budget_bytes).all()
        rows.append({"budget_fraction": fraction, "method": method, "status": statuses, "within_budget": bool(within),
                     "overhead": part.time_s.sum() / base.loc[fraction] - 1.0 if has_time else None,
                     "memory_fraction": part.memory_fraction.max() if has_time else None})
    return pd.DataFrame(rows)


def plot_schedule_comparison(table: pd.DataFrame, path: str) -> None:
    """Step-time overhead over no recompute against the memory used, per method and requested budget. A
    schedule over the requested budget (a baseline at its own peak, ours at a raised budget) is drawn at the
    memory it used with a hollow marker, never dropped; a method without a schedule is named in the title."""
    points = schedule_points(table)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    missing = []
    for i, (method, part) in enumerate(points[points.method != "no_recompute"].groupby("method")):
        color = f"C{i}"
        drawn = part[part.overhead.notna()].sort_values("memory_fraction")
        if drawn.empty:
            missing.append(f"{method} ({part.status.iloc[0]})")
            continue
        ax.plot(drawn.memory_fraction, drawn.overhead * 100, color=color, lw=0.8, alpha=0.6)
        for within, pts in drawn.groupby("within_budget"):
            ax.scatter(pts.memory_fraction, pts.overhead * 100, marker="o", s=36, color=color,
                       facecolors=color if within else "none",
                       label=f"{method}" + ("" if within else " (over the requested budget)"))
    for fraction in sorted(set(points.budget_fraction)):
        ax.axvline(fraction, color="gray", lw=0.6, ls=":")
    ax.set_xlabel("memory used (largest stage peak / its no-recompute activation peak); dotted: requested")
    ax.set_ylabel("step-time overhead over no recompute (%)")
    ax.invert_xaxis()
    ax.set_yscale("symlog", linthresh=1.0)
    title = f"{table.model.iloc[0]}, k={table.k.iloc[0]}: every method, hollow = over the requested budget"
    if missing:
        title += "\nno schedule: " + ", ".join(missing)
    ax.set_title(title, fontsize=9)
    if ax.collections:
        ax.legend(fontsize=8)
    _save(fig, path)
