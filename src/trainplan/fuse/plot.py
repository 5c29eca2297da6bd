"""The fusion figures: group sizes, coverage against the baselines, fused vs unfused time per group; plans on
the fused model vs the raw model."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from trainplan.io import atomic_path  # noqa: E402
from trainplan.plots import save_figure  # noqa: E402


def plot_fusion(groups: pd.DataFrame, compare: pd.DataFrame, measure: pd.DataFrame | None, title: str, path: str) -> None:
    """Three panels (two without measurements): sizes of our groups, coverage per method, measured times."""
    panels = 3 if measure is not None and len(measure) else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    sizes = groups["n_ops"].value_counts().sort_index()
    axes[0].bar(range(len(sizes)), sizes.to_numpy(), color="tab:blue")
    axes[0].set_xticks(range(len(sizes)), [str(n) for n in sizes.index])  # one bar per size that occurs
    axes[0].set(xlabel="ops per group", ylabel="groups", title="our groups (1 input op, 1 output op)")
    axes[0].set_yscale("log")
    x = range(len(compare))
    axes[1].bar([i - 0.2 for i in x], compare["coverage_ops"], width=0.4, label="supported ops")
    axes[1].bar([i + 0.2 for i in x], compare["coverage_time"], width=0.4, label="measured time")
    axes[1].set_xticks(list(x), [m.split(" (")[0].replace("CapabilityBasedPartitioner", "Capability") for m in compare["method"]],
                       rotation=15, fontsize=8)
    axes[1].set(ylim=(0, 1.05), ylabel="share inside groups of >= 2 ops", title="coverage, same support mask")
    axes[1].legend(fontsize=8)
    if panels == 3:
        m = measure.sort_values("unfused_s", ascending=False)
        y = range(len(m))
        axes[2].barh([i + 0.2 for i in y], m["unfused_s"] * 1e3, height=0.4, label="unfused (eager ops)")
        axes[2].barh([i - 0.2 for i in y], m["fused_s"] * 1e3, height=0.4, label="fused (Inductor)")
        axes[2].set_yticks(list(y), [f"g{g} ({n} ops)" for g, n in zip(m["group"], m["n_ops"])], fontsize=7)
        axes[2].invert_yaxis()
        axes[2].set(xlabel="median time (ms)", title="measured groups")
        axes[2].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def plot_plan_compare(table: pd.DataFrame, path: str) -> None:
    """Raw vs fused model per model, k and budget: scheduling ops, solve time, planned and measured step, peaks."""
    cases = table[["model", "k", "budget"]].drop_duplicates().reset_index(drop=True)
    graphs = sorted(table.graph.unique(), key=lambda g: (g != "raw", g))
    fig, axes = plt.subplots(1, 4, figsize=(19, 4))
    width = 0.8 / len(graphs)
    labels = [f"{m}\nk={k} b={b}" for m, k, b in cases.itertuples(index=False)]
    for j, graph in enumerate(graphs):
        rows = cases.merge(table[table.graph == graph], on=["model", "k", "budget"], how="left")
        x = [i + (j - (len(graphs) - 1) / 2) * width for i in range(len(cases))]
        axes[0].bar(x, rows.problem_ops, width=width, label=graph)
        axes[1].bar(x, rows.solve_s, width=width, label=graph)
        axes[2].bar(x, rows.planned_s, width=width, label=f"{graph}: planned", alpha=0.55)
        axes[3].bar(x, rows.peak_bytes / 2**20, width=width, label=f"{graph}: planned", alpha=0.55)
        for ax, column, scale in ((axes[2], "measured_s", 1.0), (axes[3], "measured_peak_bytes", 2**-20)):
            ax.scatter(x, rows[column] * scale, marker="_", s=300, color="black", zorder=3,
                       label="measured (validate)" if j == 0 else None)
        if "counted_peak_bytes" in rows:
            axes[3].scatter(x, rows.counted_peak_bytes / 2**20, marker="x", color="red", zorder=4,
                            label="measured, all the run holds" if j == 0 else None)
    titles = ("scheduling ops (all stages)", "our solve time (s, all stages)", "step time, one micro-batch (s)",
              "peak (MiB, largest stage)")
    for ax, title in zip(axes, titles):
        ax.set_xticks(range(len(cases)), labels, fontsize=8)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    axes[2].legend(fontsize=7)
    axes[3].legend(fontsize=7)
    fig.suptitle("planning on the fused model (each forward group one fused op) vs the raw model, same budgets")
    save_figure(fig, path, description="raw vs fused model: ops, solve time, planned and measured step time and peak")


def plot_train_step(groups: pd.DataFrame, summary: dict, title: str, path: str) -> None:
    """Per-group forward + backward speedup (eager / fused, 95% interval) against op count; the step's
    speedups over eager with every group fused, only the groups measured faster, and Inductor on the whole."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    ax = axes[0]
    if len(groups):
        err = [groups["speedup"] - groups["ci95_low"], groups["ci95_high"] - groups["speedup"]]
        ax.errorbar(groups["n_ops"], groups["speedup"], yerr=err, fmt="none", ecolor="0.6", lw=0.8)
        faster = groups["faster"].astype(bool)
        ax.scatter(groups.loc[faster, "n_ops"], groups.loc[faster, "speedup"], color="tab:green", zorder=3,
                   label=f"faster beyond noise ({int(faster.sum())})")
        ax.scatter(groups.loc[~faster, "n_ops"], groups.loc[~faster, "speedup"], facecolors="none",
                   edgecolors="tab:gray", zorder=3, label=f"not ({int((~faster).sum())})")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=8)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set(xlabel="ops in the group", ylabel="eager / fused (forward + backward)",
           title=f"compiled groups ({summary['groups_compiled']} of {summary['groups_eligible']} of >= 2 ops)")
    ax = axes[1]
    names = [n for n in ("fused", "selected", "whole") if f"{n}_vs_eager" in summary]
    labels = {"fused": "every compiled\ngroup", "selected": "groups measured\nfaster", "whole": "Inductor on the\nwhole forward"}
    values = [summary[f"{n}_vs_eager"]["speedup"] for n in names]
    lows = [v - summary[f"{n}_vs_eager"]["ci95"][0] for n, v in zip(names, values)]
    highs = [summary[f"{n}_vs_eager"]["ci95"][1] - v for n, v in zip(names, values)]
    colors = ["tab:green" if summary[f"{n}_vs_eager"]["faster"] else "tab:gray" for n in names]
    ax.bar(range(len(names)), values, yerr=[lows, highs], capsize=4, color=colors)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(names)), [labels[n] for n in names], fontsize=8)
    low = min([v - lo for v, lo in zip(values, lows)] + [1.0])
    ax.set_ylim(max(0.0, low - 0.05), max([v + hi for v, hi in zip(values, highs)] + [1.0]) + 0.05)
    ax.set(ylabel="step speedup over eager",
           title=f"training step: eager {summary['eager_step_s']:.3f} s (median of {summary['rounds']} rounds)")
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, description="fused training step: per-group and whole-step speedups with 95% intervals")
