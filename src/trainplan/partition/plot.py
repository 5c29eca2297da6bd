"""Figure of the balance loop: each iteration's and the DP partition's per-stage scheduled times."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from trainplan.budget import Budget  # noqa: E402
from trainplan.plots import nothing_to_draw, save_figure  # noqa: E402


def plot_balance(iterations: dict[str, Any], path: str) -> None:
    """Grouped bars: stage times (ms) of every iteration and of the DP partition, rate in the legend."""
    title = (f"{iterations['model']} k={iterations['k']} budget {Budget.of_fields(iterations).label}: "
             f"plan = iteration {iterations['chosen_iteration']}; stop: {iterations['stop_reason']}")
    if not iterations["iterations"]:
        nothing_to_draw(path, title, "the balance loop recorded no iteration")
        return
    rows = [(f"iteration {it['iteration']}" + (" (plan)" if it["iteration"] == iterations["chosen_iteration"] else ""),
             it) for it in iterations["iterations"]]
    rows.append(("min-max DP", iterations["dp"]))
    k = len(rows[0][1]["stages"])
    width = 0.8 / len(rows)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * k + 3), 4.0))
    for j, (label, it) in enumerate(rows):
        times = [np.nan if s["time_s"] is None else s["time_s"] * 1e3 for s in it["stages"]]
        ax.bar(np.arange(k) + j * width, times, width, label=f"{label}: rate {it['rate']:.3f}, "
               f"boundary {it['boundary_bytes'] / 2**20:.1f} MiB")
    ax.set_xticks(np.arange(k) + 0.4 - width / 2, [f"stage {s}" for s in range(k)])
    ax.set_ylabel("scheduled time per micro-batch (ms)")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=10)
    save_figure(fig, path)
