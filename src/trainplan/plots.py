"""Figures for the report (matplotlib, headless)."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from trainplan.io import atomic_path  # noqa: E402

PHASE_COLORS = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green"}
# Schedule methods' colours: no red, which marks a schedule over its budget.
METHOD_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray"]


def save_figure(fig: Any, path: str, dpi: int = 110, description: str = "") -> None:
    """Write ``fig`` as a PNG atomically and close it; ``description`` goes into the PNG's text chunk."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight", metadata={"Description": description or None})
    plt.close(fig)


def nothing_to_draw(path: str, title: str, reason: str) -> None:
    """A figure whose title says why there is nothing to draw, instead of empty axes (the reason is also
    the PNG's ``Description``)."""
    fig, ax = plt.subplots(figsize=(8, 1.6))
    ax.set_axis_off()
    ax.set_title(f"{title}\nnothing to draw: {reason}", fontsize=11, color="tab:red")
    save_figure(fig, path, description=f"nothing to draw: {reason}")


def plot_op_times(ops: pd.DataFrame, summary: dict[str, Any], path: str, top: int = 15) -> None:
    """Per-op time along the execution order, and the ops that take the most time."""
    if ops.empty:
        nothing_to_draw(path, f"{summary['model']} on {summary['device']}", "the profile has no op")
        return
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
    save_figure(fig, path)


def plot_memory(memory: pd.DataFrame, summary: dict[str, Any], path: str) -> None:
    """Live bytes while each op runs (no recompute, free after last use), above the fixed bytes."""
    if memory.empty:
        nothing_to_draw(path, str(summary["model"]), "the exported memory timeline has no op")
        return
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
    save_figure(fig, path)


def overhead_points(table: pd.DataFrame) -> pd.DataFrame:
    """The comparison table with ``drawable``: the schedules that have a time and a memory to draw (every
    method's, over its budget or not); the others are schedules a method did not produce."""
    return table.assign(over_budget=table.over_budget.fillna(False).astype(bool),
                        drawable=table.time_s.notna() & table.memory_fraction.notna() & table.overhead.notna())


def plot_schedule_comparison(table: pd.DataFrame, path: str) -> None:
    """Step-time overhead over no recompute against the memory used, per stage, method and budget.

    One panel per stage; x is the schedule's peak above the fixed bytes as a fraction of the stage's
    no-recompute activation peak, and each requested budget (a fraction, or bytes) is a vertical line on that
    scale (``requested_memory_fraction``), labelled as requested (``budget``). A schedule
    over its budget is drawn at its own peak, marked with a hollow red square, never dropped; a method
    without a schedule is named, with its status, in the panel's title.
    """
    title = f"{table.model.iloc[0]}, k={table.k.iloc[0]}" if len(table) else "schedule comparison"
    points = overhead_points(table.assign(budget=table.budget.astype(str))) if len(table) else table
    if not len(table) or not points.drawable.any():
        nothing_to_draw(path, title, "no method produced a schedule with a time and a peak at any budget"
                        if len(table) else "the comparison table is empty")
        return
    stages = sorted(points.stage.unique())
    methods = sorted(points.method.unique())
    colors = dict(zip(methods, METHOD_COLORS * len(methods)))
    fig, axes = plt.subplots(1, len(stages), figsize=(6.5 * len(stages), 4.5), squeeze=False)
    for ax, stage in zip(axes[0], stages):
        part = points[points.stage == stage]
        at_x = part.groupby("budget").requested_memory_fraction.first().dropna().sort_values()
        for label, x in at_x.items():
            ax.axvline(x, color="gray", ls=":", lw=1)
            ax.annotate(f"budget {label}", (x, 1.0), xycoords=("data", "axes fraction"),
                        rotation=90, va="top", ha="right", fontsize=8, color="gray")
        for method, rows in part[part.drawable].groupby("method"):
            rows = rows.sort_values("memory_fraction")
            x, y, over = rows.memory_fraction, rows.overhead * 100, rows.over_budget
            ax.plot(x, y, color=colors[method], lw=0.8, marker="o", ms=5, label=str(method))
            ax.scatter(x[over], y[over], facecolors="none", edgecolors="tab:red", marker="s", s=90, zorder=3)
            for (px, py), at in rows.groupby([x, y]).budget:  # which budgets each point answers
                ax.annotate("b " + ", ".join(sorted(at)), (px, py), xytext=(6, -10),
                            textcoords="offset points", fontsize=7, color=colors[method])
        if part.over_budget[part.drawable].any():
            ax.scatter([], [], facecolors="none", edgecolors="tab:red", marker="s", s=90, label="over its budget")
        missing = part[~part.drawable]
        note = "; ".join(f"{m} ({', '.join(sorted(set(rows.status)))}) at "
                         f"{', '.join(sorted(rows.budget))}" for m, rows in missing.groupby("method"))
        ax.set_title(f"stage {stage}" + (f"\nno schedule: {note}" if note else ""), fontsize=10)
        ax.set_xlabel("memory used: peak above the fixed bytes / no-recompute activation peak")
        ax.set_ylabel("step-time overhead over no recompute (%)")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.legend(fontsize=7)
    fig.suptitle(f"{title}: step-time overhead vs memory used, every method at each budget", fontsize=11, y=1.02)
    drawn = points[points.drawable]
    save_figure(fig, path, description=f"{len(drawn)} schedules drawn ({int(drawn.over_budget.sum())} over budget), "
                f"{int((~points.drawable).sum())} without a schedule")
