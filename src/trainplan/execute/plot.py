"""Figure of one validation: predicted vs measured bytes per event, and peak and time per stage."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from trainplan.budget import Budget  # noqa: E402
from trainplan.execute.plan import StagePlan  # noqa: E402
from trainplan.execute.predict import predict  # noqa: E402
from trainplan.plots import nothing_to_draw, save_figure  # noqa: E402
from trainplan.schedule import solve  # noqa: E402

MIB = 2**20


def _bars(ax: Any, predicted: list[float], measured: list[float], unit: str, title: str) -> None:
    x = np.arange(len(predicted))
    ax.bar(x - 0.2, predicted, 0.4, label="predicted", color="tab:blue")
    ax.bar(x + 0.2, measured, 0.4, label="measured", color="tab:orange")
    for xi, p, m in zip(x, predicted, measured):
        if p:
            ax.annotate(f"{(m - p) / p:+.1%}", (xi + 0.2, m), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [f"stage {i}" for i in x])
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.legend(fontsize=8)


def _headline(report: dict[str, Any], what: str = "") -> str:
    """Model, k, budget, status (and what the figure shows), the device's host memory, then the first reason of a
    failure."""
    budget = Budget.of_fields(report).label
    head = f"{report['model']} k={report['k']} budget {budget}{what}: {report['status'].upper()}"
    host = report.get("memory_model", {}).get("host_memory")
    if host:
        head += f" (host memory {host})"
    reasons = report.get("reasons") or []
    if reasons:
        head += f"\n{reasons[0][:160]}" + (f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else "")
    return head


def plot_validation(report: dict[str, Any], timeline: pd.DataFrame, path: str) -> None:
    """Timeline per stage (predicted after each event, measured peak within it, budget), then bars."""
    stages = report["stages"]
    if not stages:
        nothing_to_draw(path, _headline(report), "no stage was executed")
        return
    k = len(stages)
    fig = plt.figure(figsize=(max(11, 4 * k), 7.5))
    grid = fig.add_gridspec(2, max(k, 2), height_ratios=[3, 2], hspace=0.35)
    for i, st in enumerate(stages):
        ax = fig.add_subplot(grid[0, :] if k == 1 else grid[0, i])
        part = timeline[timeline.stage == st["index"]]
        ax.plot(part.position, part.predicted_bytes_peak / MIB, lw=1, label="predicted (with workspaces)",
                color="tab:blue")
        if "predicted_storage_bytes_peak" in part:
            ax.plot(part.position, part.predicted_storage_bytes_peak / MIB, lw=0.8, ls=":", color="tab:green",
                    label="predicted storages")
        ax.plot(part.position, part.measured_bytes_peak / MIB, lw=1, ls="--", label="measured storages",
                color="tab:orange")
        raised = " (raised: the least found)" if st.get("schedule_status") == "raised" else ""
        ax.axhline(st["budget_bytes"] / MIB, color="black", lw=0.8, label=f"budget{raised}")
        ax.set_xlabel("event")
        ax.set_ylabel("device MiB")
        ax.set_title(f"stage {st['index']}: {st['status']}", fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(_headline(report), fontsize=10)
    peaks = fig.add_subplot(grid[1, 0])
    _bars(peaks, [s["predicted_peak_bytes"] / MIB for s in stages],
          [s["measured_peak_bytes"] / MIB for s in stages], "MiB", "peak device bytes")
    memory = report.get("memory", {})
    if memory.get("peak_bytes_counted") is not None:
        peaks.axhline(memory["peak_bytes_counted"] / MIB, color="tab:red", lw=0.9, ls="--",
                      label=f"whole run, {memory['counted']}")
        peaks.legend(fontsize=8)
    _bars(fig.add_subplot(grid[1, 1]), [s["predicted_time_s"] for s in stages],
          [s["measured_time_s"] for s in stages], "s", "step time (median)")
    save_figure(fig, path, dpi=100)


def op_progress(events: list[tuple[str, str]]) -> np.ndarray:
    """x of each event: how many of the stage's ops have been computed once so far (program order).

    A recompute, swap or free shares its x with the first compute before it, spread evenly up to the
    next one, so a schedule and the no-recompute run of the same stage line up op by op.
    """
    seen: set[str] = set()
    step = np.zeros(len(events))
    for pos, (kind, op) in enumerate(events):
        if kind == "compute" and op not in seen:
            seen.add(op)
        step[pos] = len(seen)
    x = step.copy()
    for value in np.unique(step):
        where = np.flatnonzero(step == value)
        x[where] += np.arange(len(where)) / len(where)
    return x


def plot_plan_memory(report: dict[str, Any], timeline: pd.DataFrame, stages: list[StagePlan], path: str) -> None:
    """Device bytes of each stage before (no recompute, the plan's own replay) and after the chosen plan
    (predicted and measured), along the stage's ops, with the requested budget."""
    if timeline.empty:
        nothing_to_draw(path, _headline(report, ", memory before/after the plan"), "the validation executed no event")
        return
    by_index = {st["index"]: st for st in report["stages"]}
    fig, axes = plt.subplots(len(stages), 1, figsize=(12, 3.8 * len(stages)), squeeze=False, layout="constrained")
    for ax, st in zip(axes[:, 0], stages):
        before_events = solve(st.problem, method="no_recompute").events
        before = predict(st.problem, before_events)
        part = timeline[timeline.stage == st.index].sort_values("position")
        x_after = op_progress(list(zip(part.kind, part.op)))
        ax.plot(op_progress(before_events), np.array(before.bytes_peak) / MIB, lw=1, color="tab:gray",
                label=f"before: no recompute (replay), peak {before.peak / MIB:.2f} MiB")
        ax.plot(x_after, part.predicted_bytes_peak / MIB, lw=1, color="tab:blue",
                label=f"after: plan predicted, peak {part.predicted_bytes_peak.max() / MIB:.2f} MiB")
        ax.plot(x_after, part.measured_bytes_peak / MIB, lw=1, ls="--", color="tab:orange",
                label=f"after: plan measured (storages), peak {part.measured_bytes_peak.max() / MIB:.2f} MiB")
        rep = by_index.get(st.index, {})
        budget = rep.get("requested_budget_bytes", st.raw.get("budget_bytes"))
        ax.axhline(budget / MIB, color="black", lw=0.9, label=f"budget {budget / MIB:.2f} MiB")
        if rep.get("schedule_status") == "raised":
            known = "proven infeasible" if rep.get("budget_status") == "proven_infeasible" else "not met in time"
            ax.axhline(rep["budget_bytes"] / MIB, color="tab:red", lw=0.9, ls=":",
                       label=f"raised to the least budget found {rep['budget_bytes'] / MIB:.2f} MiB "
                             f"(requested: {known})")
        ax.axhline(st.problem.fixed_bytes / MIB, color="tab:green", lw=0.8, ls="-.",
                   label=f"fixed: parameters, buffers, inputs {st.problem.fixed_bytes / MIB:.2f} MiB")
        ax.set_ylim(bottom=0)
        ax.set_xlabel(f"ops of stage {st.index} computed so far (program order; recomputes and swaps in between)")
        ax.set_ylabel("device MiB")
        computes = part[part.kind == "compute"]
        ax.set_title(f"stage {st.index}: {rep.get('status', 'no report')}, schedule {st.schedule.get('status')}; "
                     f"{len(computes) - computes.op.nunique()} recomputes, {int((part.kind == 'swap_in').sum())} "
                     "swap-ins", fontsize=10)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(_headline(report, ", device memory before and after the plan"), fontsize=10)
    save_figure(fig, path, dpi=100)
