"""The pipeline run's figure: one measured step per rank (each micro-batch's forward and backward, the waits between
them) with the predicted and measured step times, and each rank's time split into compute, send/recv and idle; and
the partition methods' figure: predicted against measured step time per method."""

from __future__ import annotations

from typing import Any

import pandas as pd

from trainplan.plots import METHOD_COLORS, PHASE_COLORS, nothing_to_draw, save_figure

KIND = {"F": ("forward", PHASE_COLORS["forward"]), "B": ("backward", PHASE_COLORS["backward"])}
WAIT_COLOR = "0.85"
LINES = {"measured": ("black", "-"), "predicted": ("tab:green", "--"), "predicted_comm": ("tab:purple", ":"),
         "simulated": ("tab:orange", "-.")}


def _title(run: dict[str, Any]) -> str:
    v = run.get("stages_per_rank", 1)
    ranks = f" on {run['k'] // v} ranks" if v > 1 else ""
    return (f"{run['model']}: k={run['k']}{ranks}, budget {run.get('budget')}, {run['schedule']} "
            f"m={run['micro_batches']}, {run['threads_per_rank']} thread(s) per rank, {run['backend']}")


def plot_timeline(run: dict[str, Any], path: str) -> None:
    """Left: the measured step whose time is the median, per rank (rank 0 on top): F and B bars numbered by
    micro-batch (stage:micro-batch where a rank runs several stages), grey between them (waiting for a peer:
    send/recv and the bubble); vertical lines at the measured step time (median) and the predicted ones with and
    without the measured send/recv. Right: each rank's median compute, send/recv (measured alone) and idle seconds
    beside its stages' predicted busy time."""
    import matplotlib.pyplot as plt  # after trainplan.plots chose the headless backend

    timeline = run.get("timeline")
    if not timeline or not any(timeline["ranks"]):
        nothing_to_draw(path, _title(run), "the run recorded no compute call")
        return
    pred, measured = run["prediction"], run["measured"]
    k = len(run["ranks"])  # rows: one per rank
    several = run.get("stages_per_rank", 1) > 1
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 1.6 + 0.9 * k), gridspec_kw={"width_ratios": [3, 1]})
    for rank, actions in enumerate(timeline["ranks"]):
        y = k - 1 - rank
        ax.barh(y, timeline["step_s"], left=0, height=0.7, color=WAIT_COLOR, edgecolor="none")
        for a in actions:
            _, color = KIND[a["kind"]]
            width = a["end_s"] - a["start_s"]
            ax.barh(y, width, left=a["start_s"], height=0.7, color=color, edgecolor="white", linewidth=0.5)
            text = f"{a['stage']}:{a['micro_batch']}" if several else str(a["micro_batch"])
            ax.text(a["start_s"] + width / 2, y, text, ha="center", va="center", fontsize=7)
    lines = {"measured": (measured["step_s"], f"measured step (median of {run.get('repeats', 1)}) "
                                              f"{measured['step_s'] * 1e3:.1f} ms"),
             "predicted": (pred["step_time_s"], f"predicted {pred['step_time_s'] * 1e3:.1f} ms"),
             "predicted_comm": (pred["step_time_with_comm_s"], "predicted with measured send/recv "
                                                               f"{pred['step_time_with_comm_s'] * 1e3:.1f} ms")}
    sim = run.get("simulated")
    if sim:
        lines["simulated"] = (sim["step_time_s"], "simulated from stage costs alone "
                                                  f"{sim['step_time_s'] * 1e3:.1f} ms")
    for key, (value, label) in lines.items():
        color, style = LINES[key]
        ax.axvline(value, color=color, linestyle=style, label=label)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for _, c in KIND.values()] + [
        plt.Rectangle((0, 0), 1, 1, color=WAIT_COLOR)]
    labels = [name for name, _ in KIND.values()] + ["waiting: send/recv and idle"]
    line_handles, line_labels = ax.get_legend_handles_labels()
    ax.legend(handles + line_handles, labels + line_labels, loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.1 / k),
              ncol=3, fontsize=8)
    ax.set_yticks(range(k), [f"rank {k - 1 - y}" for y in range(k)])
    ax.set_xlabel("seconds from the step's start")
    ax.set_title(f"{_title(run)}\nstep {timeline['repeat']} of the measured ones (its slowest rank: "
                 f"{timeline['step_s'] * 1e3:.1f} ms)", fontsize=10)
    ranks = run["ranks"]
    parts = [("compute", "compute_s", "tab:blue"), ("send/recv", "send_recv_s", "tab:red"),
             ("idle", "idle_s", WAIT_COLOR)]
    left = [0.0] * k
    for label, key, color in parts:
        values = [max(0.0, r[key]) * 1e3 for r in ranks]
        bx.barh([k - 1 - i for i in range(k)], values, left=left, color=color, label=label, height=0.6)
        left = [a + b for a, b in zip(left, values)]
    busy = [sum(pred["busy_s"][s] for s in r["stages"]) for r in ranks]
    bx.scatter([b * 1e3 for b in busy], [k - 1 - i for i in range(k)], marker="D", color="tab:green",
               zorder=3, label="predicted busy m t")
    bx.set_yticks(range(k), [f"rank {k - 1 - y}" for y in range(k)])
    bx.set_xlabel("ms (medians)")
    bx.set_title("per rank", fontsize=10)
    bx.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.1 / k), ncol=2, fontsize=8)
    simulated = f", simulated {sim['step_time_s']:.4g} s" if sim else ""
    save_figure(fig, path, description=f"{_title(run)}: measured {measured['step_s']:.4g} s, predicted "
                f"{pred['step_time_s']:.4g} s, with send/recv {pred['step_time_with_comm_s']:.4g} s{simulated}")


#: the settings a methods table holds, one panel each
SETTING = ["model", "budget", "schedule", "m"]


def _method_label(row: pd.Series) -> str:
    if isinstance(row.get("error"), str):
        return f"{row['method']}\n(failed)"
    same = row.get("same_as")
    over = row.get("over_budget_ranks")
    notes = ([f"= {same}"] if isinstance(same, str) else []) + \
        ([f"{int(over)} rank(s) over budget"] if isinstance(over, (int, float)) and over == over and over > 0 else [])
    return row["method"] + (f"\n({', '.join(notes)})" if notes else "")


def plot_methods(table: pd.DataFrame, path: str) -> None:
    """One panel per setting (model, budget, schedule, m) of a partition-methods table (``comparison_row``'s
    rows with those columns and ``method``): per method the measured step time (median; whiskers: the fastest and
    slowest measured step), the balance rule's prediction (m + k - 1) t_max (open diamond) and that prediction
    with the measured send/recv (filled diamond). A method that failed is labelled so and draws nothing; one that
    shares another's cuts shares its run; ranks over their budget are named under the method."""
    import matplotlib.pyplot as plt  # after trainplan.plots chose the headless backend

    title = "partition methods run as pipelines"
    ran = table[table["measured_step_s"].notna()] if "measured_step_s" in table else table.iloc[0:0]
    if ran.empty:
        nothing_to_draw(path, title, "no method ran")
        return
    settings = list(table.groupby(SETTING, sort=False))
    cols = min(len(settings), 2)
    rows = -(-len(settings) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.4 * rows), squeeze=False)
    methods = list(dict.fromkeys(table["method"]))
    described = []
    for ax, ((model, budget, schedule, m), rows_) in zip(axes.flat, settings):
        x = range(len(rows_))
        for i, (_, row) in zip(x, rows_.iterrows()):
            color = METHOD_COLORS[methods.index(row["method"]) % len(METHOD_COLORS)]
            if isinstance(row.get("error"), str) or row.get("measured_step_s") != row.get("measured_step_s"):
                continue
            low, high = row.get("measured_step_min_s"), row.get("measured_step_max_s")
            spread = None if low is None or high is None or low != low else \
                [[row["measured_step_s"] - low], [high - row["measured_step_s"]]]
            ax.bar(i, row["measured_step_s"], color=color, width=0.6, yerr=spread, capsize=4)
            ax.scatter(i, row["predicted_step_s"], marker="D", facecolor="white", edgecolor="black", zorder=3)
            ax.scatter(i, row["predicted_step_comm_s"], marker="D", color="black", zorder=3)
            described.append(f"{model} {schedule} m={m} {row['method']}: measured {row['measured_step_s']:.4g} s, "
                             f"predicted {row['predicted_step_comm_s']:.4g} s with send/recv")
        ax.set_xticks(list(x), [_method_label(r) for _, r in rows_.iterrows()], fontsize=8)
        ax.set_ylabel("step time (s)")
        ax.set_title(f"{model}, budget {budget}, {schedule} m={m}", fontsize=10)
    for ax in list(axes.flat)[len(settings):]:
        ax.set_axis_off()
    handles = [plt.Rectangle((0, 0), 1, 1, color="0.5"),
               plt.Line2D([], [], marker="D", linestyle="", markerfacecolor="white", markeredgecolor="black"),
               plt.Line2D([], [], marker="D", linestyle="", color="black")]
    fig.legend(handles, ["measured (median; whiskers: fastest and slowest step)", "predicted (m + k - 1) t_max",
                         "predicted with measured send/recv"], loc="lower center", ncol=3, fontsize=8,
               bbox_to_anchor=(0.5, -0.02))
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    save_figure(fig, path, description="; ".join(described))
