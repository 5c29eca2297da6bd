"""One summary row per model of the layout study."""

from __future__ import annotations

from typing import Any


def summary_row(plan: dict[str, Any], execution: dict[str, Any]) -> dict[str, Any]:
    """Plan status and solve times, measured step per plan, speedups, predictor scores, regret, checks."""
    cfg = execution["configs"]
    base = plan["baselines"]
    return {
        "model": execution["model"], "convs": len(plan["layouts"]) - 1, "status": plan["status"],
        "method": plan["method"], "solve_time_s": plan["solve_time_s"],
        "backtrack_status": base["backtrack"]["status"], "backtrack_time_s": base["backtrack"]["solve_time_s"],
        "backtrack_nodes": base["backtrack"]["nodes_explored"], "n_nhwc": cfg["planned"]["n_nhwc"],
        "best_single": base["best_single"]["chosen"], "measured_best_single": execution["measured_best_single"],
        **{f"step_{name}_s": cfg[name]["measured_step_s"] for name in
           ("unmodified", "all_nchw", "all_nhwc", "best_single", "planned", "predicted_plan")},
        "predicted_planned_step_s": cfg["planned"]["predicted_step_s"],
        "speedup_vs_all_nchw": execution["speedup_vs_all_nchw"],
        "speedup_vs_best_single": execution["speedup_vs_best_single"],
        "speedup_ci95_low": execution["speedup_vs_best_single_ci95"][0],
        "speedup_ci95_high": execution["speedup_vs_best_single_ci95"][1],
        "slower_than_best_single": execution["planned_slower_than_best_single"],
        "faster_than_best_single": execution["planned_faster_than_best_single"],
        "adopted": execution["adopted"]["config"],
        "adopted_speedup": execution["adopted"]["speedup_vs_best_single"],
        "adopted_ci95_low": execution["adopted"]["speedup_vs_best_single_ci95"][0],
        "adopted_ci95_high": execution["adopted"]["speedup_vs_best_single_ci95"][1],
        "adopted_slower_than_best_single": execution["adopted"]["slower_than_best_single"],
        "predictor_r2": execution["predictor"]["r2"], "predictor_median_rel_error": execution["predictor"]["median_rel_error"],
        "predictor_outside_sweep": execution["predictor"].get("outside_sweep"),  # absent before 2026-11-27
        "regret_problem_s": execution["regret"]["problem_time_s"], "regret_step_s": execution["regret"]["measured_step_s"],
        "gradients_ok": execution["gradients_ok"], "clock": execution["clock"],
        "load_max": execution["load_average"]["max"],
    }
