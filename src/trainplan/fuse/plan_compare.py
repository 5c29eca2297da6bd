"""Planning on the fused graph next to the raw graph: op counts, solve time, planned and measured step time.

One row per (model, graph, k, budget), where graph is ``raw`` or the fusion target whose fused
graph was planned (model ``<model>+<target>``), read from the artifacts of the same workflow run:

- ``graph_ops`` (the partition's ops) and ``problem_ops`` (scheduling ops over all stages, after views
  are folded into their bases);
- ``solve_s``: our scheduler's solve time summed over the stages of the ``schedule`` rule;
- ``planned_s`` (the balance plan's stage times summed: one micro-batch's step, what validation runs),
  ``t_max_s`` and ``gpipe_step_s`` of the plan, its stage budgets and peaks;
- ``measured_s`` and ``status`` from executing the plan (``validate``);
- on a fused graph, ``planned_fused_kernels_s``: ``planned_s`` with every compute of a group that was
  compiled and timed (``fuse_measure``) costed at its measured fused time instead of its ops run one by
  one. The executor runs a group's ops one by one, so this figure is predicted only, not validated.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from trainplan.budget import Budget


def _fused_saving(stage: dict[str, Any], fused_s: dict[str, float], unfused_s: dict[str, float]) -> float:
    """Seconds a stage's schedule saves when each compute of a timed group runs as its fused kernel."""
    computes = [op for kind, op in stage["schedule"]["events"] if kind == "compute"]
    return float(sum(unfused_s[op] - fused_s[op] for op in computes if op in fused_s))


def plan_row(*, model: str, graph: str, partition: dict[str, Any], schedules: dict[str, Any], plan: dict[str, Any],
             validation: dict[str, Any], coarse_ops: pd.DataFrame | None = None) -> dict[str, Any]:
    """One row of the comparison; ``coarse_ops`` is the fused graph's profile (``fused_s`` per group node)."""
    stages = plan["stages"]
    planned = float(sum(st["time_s"] for st in stages))
    row = {
        "model": model, "graph": graph, "k": int(plan["k"]),
        "budget": Budget.of_fields(plan).label,
        "graph_ops": int(partition["n_ops"]),
        "problem_ops": int(sum(sum(1 for op in st["problem"]["ops"] if not op.get("boundary")) for st in schedules["stages"])),
        "solve_s": float(sum(st["schedule"]["solve_seconds"] for st in schedules["stages"])),
        "planned_s": planned, "t_max_s": float(plan["balance"]["t_max_s"]),
        "gpipe_step_s": float(plan["balance"]["gpipe_step_time_s"]),
        "budget_bytes": int(sum(st["budget_bytes"] for st in stages)),
        "peak_bytes": int(max(st["peak_bytes"] for st in stages)),
        "recomputes": int(sum(st["schedule"].get("recomputes", 0) for st in stages)),
        "status": str(validation["status"]), "measured_s": float(validation["measured_time_s"]),
        "planned_fused_kernels_s": np.nan,
    }
    if coarse_ops is not None:
        timed = coarse_ops[coarse_ops.fused_s.notna()]
        fused_s = dict(zip(timed.name, timed.fused_s))
        unfused_s = dict(zip(timed.name, timed.time_s))
        row["planned_fused_kernels_s"] = planned - sum(_fused_saving(st, fused_s, unfused_s) for st in stages)
    return row


def compare_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows with each fused graph's ratios to the raw graph of the same model, k and budget."""
    table = pd.DataFrame(rows).sort_values(["model", "k", "budget", "graph"], ignore_index=True)
    raw = table[table.graph == "raw"].set_index(["model", "k", "budget"])
    for column in ("problem_ops", "solve_s", "planned_s", "measured_s"):
        ref = [raw[column].get((m, k, b), np.nan) for m, k, b in zip(table.model, table.k, table.budget)]
        table[f"{column}_vs_raw"] = table[column] / np.asarray(ref, dtype=float)
    return table
