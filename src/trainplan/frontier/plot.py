"""The frontier figure: each method's median step time against its median measured peak."""

from __future__ import annotations

from typing import Any

import pandas as pd

from trainplan.frontier.method_names import PLAIN, VALUED
from trainplan.plots import save_figure

_MARKERS = dict(zip((*PLAIN, *VALUED), "s^oDx*<>vPXh", strict=True))


def plot_frontier(rows: list[dict[str, Any]], path: str, title: str) -> None:
    """One panel per model, each point labelled with its method's budget; bars: the min-max step time over every
    measured step."""
    import matplotlib.pyplot as plt

    frame = pd.DataFrame([r for r in rows if "error" not in r])
    models = sorted(frame.model.unique())
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        part = frame[frame.model == model]
        for kind, marker in _MARKERS.items():
            pts = part[part.method.str.split("@").str[0] == kind]
            if len(pts):
                ax.errorbar(pts.peak_mib, pts.step_s, yerr=[pts.step_s - pts.step_min_s, pts.step_max_s - pts.step_s],
                            fmt=marker, label=kind, capsize=3)
                for _, r in pts.iterrows():
                    ax.annotate(r.method.partition("@")[2], (r.peak_mib, r.step_s), fontsize=7,
                                xytext=(4, 4), textcoords="offset points")
        ax.set(title=model, xlabel="measured peak above parameters, batch, optimizer state (MiB)",
               ylabel="step time (s, median; bars: min-max)")
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.92))  # the suptitle's two lines above the panels' titles
    save_figure(fig, path)
