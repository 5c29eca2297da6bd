"""Planning on the fused models next to the raw ones: op counts, solve time, planned and measured step time and peak.

One row per (model, graph, k, budget), where graph is ``raw`` or the fusion target whose fused model was
planned (model ``<model>+<target>``: its forward groups run as fused ops, one node forward and one backward in
the traced step), read from the artifacts of the same workflow run:

- ``graph_ops`` (the traced step's ops) and ``problem_ops`` (scheduling ops over all stages, after views are
  folded into their bases); on a fused model ``groups_fused`` (groups run as fused ops), ``groups_fx`` (those
  of them Inductor failed on, run as their fx graphs) and ``ops_fused`` (forward ops inside them);
- ``solve_s``: our scheduler's solve time summed over the stages of the ``schedule`` rule;
- ``planned_s`` (the balance plan's stage times summed: one micro-batch's step, what validation runs),
  ``t_max_s`` and ``gpipe_step_s`` of the plan, its stage budgets and predicted peak, ``budget_status`` (the
  stages' schedule statuses: ``raised`` where the requested budget was below what any schedule reaches);
- ``measured_s``, ``measured_peak_bytes`` and ``status`` from executing the plan (``validate``): the peak of the
  storages the plan's events hold; ``counted_peak_bytes`` the whole run's peak counting everything it holds (the
  process's on the CPU), which sees what a fused op allocates inside its kernels too;
- on a fused model ``grad_check_ratio``, ``grad_float64_rel_err`` and ``grads_passed``: its step's loss and
  gradients against the unfused model's, both against the step in float64, and where that fails the groups fused
  in float64 against the float64 step (the export's check, ``fuse.planned.gradients_vs_unfused``; the validated
  plan's gradients equal its own model's step).

A fused op's time is its own profiled time (the profile runs the fused kernels), so planned and measured times
of the two graphs compare the fused step with the raw one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from trainplan.budget import Budget


def plan_row(*, model: str, graph: str, graph_summary: dict[str, Any], partition: dict[str, Any],
             schedules: dict[str, Any], plan: dict[str, Any], validation: dict[str, Any]) -> dict[str, Any]:
    """One row of the comparison; ``graph_summary`` is the export's ``graph.json`` (a fused model's ``fusion``)."""
    stages = plan["stages"]
    fusion = graph_summary.get("fusion") or {}
    measured_peaks = [st.get("measured_peak_bytes") for st in validation.get("stages", [])]
    return {
        "model": model, "graph": graph, "k": int(plan["k"]),
        "budget": Budget.of_fields(plan).label,
        "graph_ops": int(partition["n_ops"]),
        "problem_ops": int(sum(sum(1 for op in st["problem"]["ops"] if not op.get("boundary")) for st in schedules["stages"])),
        "groups_fused": fusion.get("groups_fused", np.nan), "groups_fx": fusion.get("groups_fx", np.nan),
        "ops_fused": fusion.get("ops_fused", np.nan),
        "solve_s": float(sum(st["schedule"]["solve_seconds"] for st in schedules["stages"])),
        "planned_s": float(sum(st["time_s"] for st in stages)), "t_max_s": float(plan["balance"]["t_max_s"]),
        "gpipe_step_s": float(plan["balance"]["gpipe_step_time_s"]),
        "budget_bytes": int(sum(st["budget_bytes"] for st in stages)),
        "peak_bytes": int(max(st["peak_bytes"] for st in stages)),
        # the stages' schedule statuses: "raised" where a requested budget was below what any schedule reaches
        "budget_status": ",".join(sorted({str(st["status"]) for st in stages})),
        "recomputes": int(sum(st["schedule"].get("recomputes", 0) for st in stages)),
        "status": str(validation["status"]), "measured_s": float(validation["measured_time_s"]),
        "measured_peak_bytes": (max(p for p in measured_peaks if p is not None)
                                if any(p is not None for p in measured_peaks) else np.nan),
        "counted_peak_bytes": (validation.get("memory") or {}).get("peak_bytes_counted", np.nan),
        **_gradient_check(fusion),
    }


def _gradient_check(fusion: dict[str, Any]) -> dict[str, Any]:
    """A fused model's gradients against the unfused model's (the export's check, ``fuse.planned.
    gradients_vs_unfused``): the float32 step's worst error over its tolerance (<= 1 passes), the float64 check's
    worst relative error where that ran, and the verdict; NaN and None for a raw model."""
    check = fusion.get("gradients_vs_unfused")
    if not check:
        return {"grad_check_ratio": np.nan, "grad_float64_rel_err": np.nan, "grads_passed": None}
    return {"grad_check_ratio": float(check["fused"]["worst_ratio"]),
            "grad_float64_rel_err": float(check["float64"]["max_rel_err"]) if "float64" in check else np.nan,
            "grads_passed": bool(check["passed"])}


def compare_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows with each fused model's ratios to the raw model of the same model, k and budget."""
    table = pd.DataFrame(rows).sort_values(["model", "k", "budget", "graph"], ignore_index=True)
    raw = table[table.graph == "raw"].set_index(["model", "k", "budget"])
    for column in ("graph_ops", "problem_ops", "solve_s", "planned_s", "measured_s", "peak_bytes",
                   "measured_peak_bytes", "counted_peak_bytes"):
        ref = [raw[column].get((m, k, b), np.nan) for m, k, b in zip(table.model, table.k, table.budget)]
        table[f"{column}_vs_raw"] = table[column] / np.asarray(ref, dtype=float)
    return table
