"""The pipeline run's artifact: per-rank measurements beside the balance rule's prediction for the schedule."""

from __future__ import annotations

from typing import Any

from trainplan.budget import FIELDS
from trainplan.execute.plan import StagePlan
from trainplan.partition.pipeline import FORMULAS, pipeline_metrics

PREDICTION_FORMULAS = {
    "step_time_s": f"{FORMULAS['gpipe_step_time_s']} (the balance rule's; 1F1B has the same bubble)",
    "busy_s": "m * the stage's scheduled time (plan stages[i].schedule.time, one micro-batch forward+backward)",
    "idle_s": "step_time_s - busy_s",
    "peak_bytes": "1F1B: " + FORMULAS["peak_1f1b_bytes"] + "; GPipe: the same with all m micro-batches in "
                  "flight, schedule peak_bytes + (m - 1) * activation_bytes",
}
MEASURED = {
    "step_s": "wall time of one schedule.step (after warm-up steps), this rank",
    "compute_s": "wall time in PipelineStage.forward_one_chunk and backward_one_chunk (the stage's halves, "
                 "autograd's gradient accumulation), summed over micro-batches",
    "forward_half_s": "of which in the stage's planned forward half (carriers packed and unpacked included)",
    "backward_half_s": "of which in its planned backward half",
    "send_recv_s": "this rank's time sending and receiving one step's carriers alone, link by link after a "
                   "barrier (transfer without waiting for a peer)",
    "idle_s": "step_s - compute_s - send_recv_s: waiting for a peer (the bubble) and the schedule's own work",
    "peak_bytes": "the most the rank's memory rose during the measured step above what it held before it",
}


def prediction(data: dict[str, Any], stages: list[StagePlan], schedule: str, m: int) -> dict[str, Any]:
    """The balance rule's numbers for ``schedule`` with ``m`` micro-batches, from the plan's per-stage times."""
    k = len(stages)
    times = [float(st.schedule["time"]) for st in stages]
    peaks = [int(st.schedule["peak_bytes"]) for st in stages]
    stash = [data["stages"][i].get("activation_bytes") for i in range(k)]
    metrics = pipeline_metrics(times, peaks, [int(a or 0) for a in stash], m)
    step = metrics.gpipe_step_time_s
    if None in stash:
        peak: list[int] | None = None  # not a balance plan: no stash sizes
    elif schedule == "gpipe":
        peak = [p + (m - 1) * int(a) for p, a in zip(peaks, stash)]
    else:
        peak = metrics.peak_1f1b_bytes
    return {"stage_times_s": times, "t_max_s": metrics.t_max_s, "step_time_s": step,
            "busy_s": [m * t for t in times], "idle_s": [step - m * t for t in times],
            "schedule_peak_bytes": peaks, "activation_bytes": stash, "peak_bytes": peak,
            "formulas": PREDICTION_FORMULAS}


def artifact(settings: Any, data: dict[str, Any], ranks: list[dict[str, Any]], predicted: dict[str, Any], *,
             device: str, backend: str, memory: str) -> dict[str, Any]:
    """The run's record: settings, per-rank numbers (rank order), the combined loss, the prediction."""
    last = ranks[-1]
    losses = last["losses"]
    out = {
        "model": settings.model,
        "plan": str(settings.plan),
        "k": len(ranks),
        **{key: data.get(key) for key in FIELDS},
        "schedule": settings.schedule,
        "micro_batches": settings.micro_batches,
        "device": device,
        "backend": backend,
        "threads_per_rank": settings.threads,
        "warmup_steps": settings.warmup,
        "malloc": memory,
        "loss": sum(losses) / len(losses),
        "losses": losses,
        "measured": {"step_s": max(r["step_s"] for r in ranks), "definitions": MEASURED},
        "ranks": ranks,
        "prediction": predicted,
    }
    if all("check" in r for r in ranks):
        out["check"] = {"planned_bit_identical": all(r["check"]["planned"]["bit_identical"] for r in ranks),
                        "eager_close": all(r["check"]["eager"]["close"] for r in ranks)}
    return out
