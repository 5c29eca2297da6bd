"""The workflow-level summary table of validation documents (``execute.validate``): plain dictionaries, no torch."""

from __future__ import annotations

from typing import Any


def summary_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per stage of a validation document, for the workflow-level summary table: the stage's numbers,
    its schedule's status (``raised`` where the requested budget was not met), and the whole run's peaks."""
    base = {k: report.get(k) for k in ("model", "device", "k", "budget", "budget_fraction")}
    base["host_memory"] = report.get("memory_model", {}).get("host_memory")
    memory = report.get("memory", {})
    whole = {f"run_{k}": memory.get(k) for k in ("peak_bytes_allocator", "peak_bytes_process", "peak_bytes_host_pinned",
                                                  "peak_bytes_counted", "budget_respected")}
    grads = report.get("gradients", {}).get("vs_compiled_step", {})
    rows = []
    for st in report["stages"] or [{"index": None, "reasons": report["reasons"]}]:
        rows.append({**base, "stage": st.get("index"), "status": report["status"],
                     "stage_status": st.get("status", "failed"),
                     **{k: st.get(k) for k in ("schedule_status", "requested_budget_bytes", "budget_status",
                                               "predicted_peak_bytes", "measured_peak_bytes", "peak_rel_err",
                                               "host_peak_bytes", "counted_peak_bytes",
                                               "budget_bytes", "budget_respected", "over_budget_rel",
                                               "predicted_time_s", "measured_time_s", "time_rel_err", "load_factor",
                                               "link_scale", "predicted_time_now_s", "time_rel_err_load_adjusted",
                                               "communication_s")},
                     **whole,
                     "grad_max_abs_err": grads.get("max_abs_err"), "grad_max_rel_err": grads.get("max_rel_err"),
                     "reasons": " | ".join(st.get("reasons", [])), "unreliable": " | ".join(st.get("unreliable", []))})
    return rows
