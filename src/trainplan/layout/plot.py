"""Figures of the layout stage: per model (per-conv times and chosen layouts, step time per plan) and the study
(predictor on held-out convs, I/O ratio to the lower bound per conv)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from trainplan.plots import save_figure


def plot_model(pred: pd.DataFrame, execution: dict[str, Any], path: str) -> None:
    """Left: measured conv time in each layout per layer, the chosen layout marked. Right: measured and
    predicted step time of every plan and baseline, the adopted one named, the exact plan's speedup interval."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    idx = range(len(pred))
    ax1.plot(idx, pred["meas_nchw"] * 1e3, "o-", ms=3, label="NCHW (measured)")
    ax1.plot(idx, pred["meas_nhwc"] * 1e3, "s-", ms=3, label="NHWC (measured)")
    chosen = [row.meas_nhwc if row.chosen_nhwc else row.meas_nchw for row in pred.itertuples()]
    ax1.scatter(idx, [c * 1e3 for c in chosen], facecolors="none", edgecolors="k", s=60, label="chosen layout")
    ax1.set_xlabel("conv (call order)")
    ax1.set_ylabel("forward + backward, ms")
    ax1.set_yscale("log")
    ax1.legend(fontsize=8)
    ax1.set_title(f"{execution['model']}: per-layer layout ({execution['clock']} clock)")
    names = [n for n in ("all_nchw", "all_nhwc", "best_single", "backtrack", "predicted_plan", "planned")
             if n in execution["configs"]]
    meas = [execution["configs"][n]["measured_step_s"] * 1e3 for n in names]
    predicted = [execution["configs"][n]["predicted_step_s"] * 1e3 for n in names]
    pos = range(len(names))
    ax2.barh([p + 0.2 for p in pos], meas, height=0.4, label="measured")
    ax2.barh([p - 0.2 for p in pos], predicted, height=0.4, label="predicted")
    adopted = execution["adopted"]["config"]
    ax2.set_yticks(list(pos), [f"{n} (adopted)" if n == adopted else n for n in names])
    ax2.set_xlabel("training step, ms (median)")
    load = execution["load_average"]
    low, high = execution["speedup_vs_best_single_ci95"]
    ax2.set_title(f"exact plan vs fastest single {execution['speedup_vs_best_single']:.3f}x [{low:.3f}, {high:.3f}]; "
                  f"load avg {load['min']:.1f}-{load['max']:.1f}", fontsize=8)
    ax2.set_xlim(0, 1.5 * max(meas + predicted))  # room for the legend right of the bars
    ax2.legend(fontsize=8, loc="best")
    save_figure(fig, path)


def plot_summary(summary: pd.DataFrame, preds: pd.DataFrame, io: pd.DataFrame, path: str) -> None:
    """Speedup of the exact and the adopted layouts per model (95% intervals), predicted vs measured conv time, I/O
    over the bound."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ax = axes[0]
    x = np.arange(len(summary))
    ax.bar(x, summary.speedup_vs_all_nchw, color="#c6dbef", label="exact plan vs all NCHW")
    for shift, col, low, high, style, label in (
            (-0.12, "speedup_vs_best_single", "speedup_ci95_low", "speedup_ci95_high", "k^", "exact plan vs fastest single"),
            (0.12, "adopted_speedup", "adopted_ci95_low", "adopted_ci95_high", "rs", "adopted plan vs fastest single")):
        err = np.vstack([summary[col] - summary[low], summary[high] - summary[col]])
        ax.errorbar(x + shift, summary[col], yerr=err, fmt=style, ms=5, capsize=3, label=label)
    ax.axhline(1.0, color="grey", lw=0.8)
    shown = summary[["speedup_vs_all_nchw", "speedup_ci95_low", "speedup_ci95_high", "adopted_ci95_low", "adopted_ci95_high"]]
    ax.set_ylim(min(0.9, shown.min().min() - 0.02), max(1.1, shown.max().max() + 0.02))
    ax.set_ylabel("measured step speedup (95% interval)")
    ax.set_xticks(x, summary.model, rotation=30)
    ax.legend(fontsize=8)
    ax = axes[1]
    for lay in ("nchw", "nhwc"):
        ax.loglog(preds[f"meas_{lay}"] * 1e3, preds[f"pred_{lay}"] * 1e3, ".", label=lay.upper())
    lo, hi = ax.get_xlim()
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xlabel("measured conv fwd+bwd, ms")
    ax.set_ylabel("predicted, ms")
    ax.set_title("predictor on the models' convs (held out)", fontsize=9)
    ax.legend(fontsize=8)
    ax = axes[2]
    for s, part in io.groupby("S"):
        ax.plot(range(len(part)), part.paper_ratio, ".", label=f"paper tile, S={s}")
        if "simulated_ratio" in part:
            ax.plot(range(len(part)), part.simulated_ratio, "x", label=f"simulated, S={s}")
    ax.axhline(1.2, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("conv")
    ax.set_ylabel("dataflow I/O / lower bound")
    ax.legend(fontsize=7)
    save_figure(fig, path)
