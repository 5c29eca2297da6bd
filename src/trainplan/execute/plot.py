"""Figure of one validation: predicted vs measured bytes per event, and peak and time per stage."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from trainplan.io import atomic_path  # noqa: E402

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


def plot_validation(report: dict[str, Any], timeline: pd.DataFrame, path: str) -> None:
    """Timeline per stage (predicted after each event, measured peak within it, budget), then bars."""
    stages = report["stages"]
    k = max(1, len(stages))
    fig = plt.figure(figsize=(max(11, 4 * k), 7.5))
    grid = fig.add_gridspec(2, max(k, 2), height_ratios=[3, 2], hspace=0.35)
    for i, st in enumerate(stages):
        ax = fig.add_subplot(grid[0, :] if k == 1 else grid[0, i])
        part = timeline[timeline.stage == st["index"]]
        ax.plot(part.position, part.predicted_bytes_peak / MIB, lw=1, label="predicted", color="tab:blue")
        ax.plot(part.position, part.measured_bytes_peak / MIB, lw=1, ls="--", label="measured", color="tab:orange")
        ax.axhline(st["budget_bytes"] / MIB, color="black", lw=0.8, label="budget")
        ax.set_xlabel("event")
        ax.set_ylabel("device MiB")
        ax.set_title(f"stage {st['index']}: {st['status']}", fontsize=10)
        ax.legend(fontsize=8)
    status = report["status"].upper()
    reasons = report.get("reasons") or []
    head = f"{report['model']} k={report['k']} budget {report['budget_fraction']}: {status}"
    if reasons:
        head += f"\n{reasons[0][:160]}" + (f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else "")
    fig.suptitle(head, fontsize=10)
    if stages:
        _bars(fig.add_subplot(grid[1, 0]), [s["predicted_peak_bytes"] / MIB for s in stages],
              [s["measured_peak_bytes"] / MIB for s in stages], "MiB", "peak device bytes")
        _bars(fig.add_subplot(grid[1, 1]), [s["predicted_time_s"] for s in stages],
              [s["measured_time_s"] for s in stages], "s", "step time (median)")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
