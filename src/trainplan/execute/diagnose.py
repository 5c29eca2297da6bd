"""Measured against predicted, stage by stage: peak, budget, time, and the events and ops the plan missed."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from trainplan.execute.plan import StagePlan
from trainplan.execute.predict import Predicted, predict
from trainplan.execute.runner import EventRecord


@dataclass(frozen=True)
class Tolerances:
    """Pass thresholds: relative peak and raw step-time errors, budget overrun (0: the measured peak may not
    pass the budget), per-event/op byte error (as a fraction of the stage's predicted peak), ``allclose``
    tolerances of loss and gradients, and ``load_rel``: how far the no-recompute run timed beside the plan
    may be off its profiled time before the machine counts as busy and the time check as unreliable.
    ``meter_rel`` and ``meter_abs_mib``: how far the whole run's counted peak (the process's on the CPU, the
    device's on CUDA) may pass the stages' budgets, relative plus absolute: what a process holds beyond the
    plan's storages (allocator rounding, BLAS workspaces, the interpreter; docs/validation.md)."""

    peak_rel: float = 0.10
    budget_over: float = 0.0
    time_rel: float = 0.10
    event_rel: float = 0.10
    grad_rtol: float = 1e-5
    grad_atol: float = 1e-6
    load_rel: float = 0.10
    meter_rel: float = 0.02
    meter_abs_mib: float = 2.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def meter_slack_bytes(self, budget_bytes: int) -> int:
        """Bytes the whole run's counted peak may pass ``budget_bytes`` by."""
        return int(self.meter_rel * budget_bytes + self.meter_abs_mib * 2**20)


def _rel(measured: float, predicted: float) -> float | None:
    return (measured - predicted) / predicted if predicted else None


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def _event(stage: StagePlan, rec: EventRecord, predicted: int) -> dict[str, Any]:
    raw = next(o for o in stage.raw["ops"] if o["id"] == rec.op)
    return {"position": rec.position, "kind": rec.kind, "op": rec.op, "nodes": raw["nodes"][:5],
            "storages": raw["storages"], "predicted_bytes": predicted, "measured_bytes": rec.bytes_peak}


def _size_mismatches(stage: StagePlan, records: list[EventRecord]) -> list[dict[str, Any]]:
    """Ops whose real storages hold other bytes than the plan's ``bytes``, largest difference first."""
    plan = {o["id"]: o for o in stage.raw["ops"]}
    seen: dict[str, dict[str, Any]] = {}
    for rec in records:
        op = plan[rec.op]
        if rec.kind == "compute" and rec.op_bytes >= 0 and rec.op_bytes != op["bytes"] and rec.op not in seen:
            seen[rec.op] = {"op": rec.op, "nodes": op["nodes"][:5], "storages": op["storages"],
                            "plan_bytes": op["bytes"], "real_bytes": rec.op_bytes}
    return sorted(seen.values(), key=lambda m: -abs(m["real_bytes"] - m["plan_bytes"]))


def _budget_fields(stage: StagePlan) -> dict[str, Any]:
    """The stage's schedule status (``raised`` where the requested budget was not met: docs/schedule.md), the
    budget it meets, the requested one and what is known about that (``budget_status``)."""
    sched = stage.schedule
    return {"schedule_status": sched.get("status"), "budget_bytes": stage.budget_bytes,
            "requested_budget_bytes": stage.requested_budget_bytes, "budget_status": sched.get("budget_status"),
            "held_gradient_bytes": stage.held_bytes}


@dataclass(frozen=True)
class StageTime:
    """Measured step times of a stage, run by run, and of its no-recompute baseline run right after each,
    both without communication; the median time of receiving (and later freeing) storages from other
    stages; the plan's host-link bandwidth over the one measured in this process."""

    runs_s: list[float]
    baseline_runs_s: list[float]
    communication_s: float = 0.0
    link_scale: float = 1.0

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs_s)

    @property
    def baseline_s(self) -> float:
        return statistics.median(self.baseline_runs_s)


def _memory_checks(stage: StagePlan, records: list[EventRecord], pred: Predicted, tol: Tolerances,
                   host_shared: bool) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """Reasons the stage fails on memory (stated vs replayed numbers, measured peak vs plan, counted peak vs
    budget, the first diverging event, tensor sizes); the memory fields of the report, and its diagnosis (the
    peak event, the first divergence, the size mismatches). ``host_shared``: host copies sit in the budgeted
    memory (shared host memory) and count toward the budget."""
    sched, i = stage.schedule, stage.index
    stated_peak, stated_time, budget = int(sched["peak_bytes"]), float(sched["time"]), stage.budget_bytes
    solved = pred if stage.solved is stage.problem else predict(stage.solved, stage.events)  # what it states
    measured_peak = max(r.bytes_peak for r in records)
    counted_peak = max(r.bytes_peak + (r.host_bytes if host_shared else 0) for r in records)
    reasons: list[str] = []
    if stated_peak != solved.peak:
        reasons.append(f"stage {i}: the plan states peak_bytes {stated_peak} B but its events replay to {solved.peak} B")
    if abs(stated_time - solved.time) > 1e-9 * max(1.0, solved.time):
        reasons.append(f"stage {i}: the plan states time {stated_time:.6f} s but its events replay to {solved.time:.6f} s")
    planned_peak = stage.alone_peak_bytes  # run alone: its gradients held to the end; workspaces counted
    storage_peak = pred.storage_peak_bytes  # what the storage meter sees: the plan's storages only
    tol_bytes = tol.event_rel * pred.peak
    diverged = [(r, p) for r, p in zip(records, pred.storage_peak) if abs(r.bytes_peak - p) > tol_bytes]
    first = _event(stage, *diverged[0]) if diverged else None
    peak_at = max(range(len(records)), key=lambda j: records[j].bytes_peak)
    peak_event = {**_event(stage, records[peak_at], pred.storage_peak[peak_at]),
                  "unplanned_bytes": records[peak_at].unplanned}
    held = ", ".join(f"'{op}' {b} B" for op, b in sorted(peak_event["unplanned_bytes"].items(), key=lambda x: -x[1])[:5])
    why = f"; at the measured peak (event {peak_at} {records[peak_at].kind} '{records[peak_at].op}') the device also held " \
          f"kernel outputs the plan does not count: {held}" if held else ""
    peak_err = _rel(measured_peak, storage_peak)
    if peak_err is None or abs(peak_err) > tol.peak_rel:
        over = next((r for r in records if r.bytes_peak > storage_peak * (1 + tol.peak_rel)), None)
        where = f"; first above it at event {over.position} {over.kind} '{over.op}'" if over else ""
        reasons.append(f"stage {i}: measured storage peak {measured_peak} B is {_pct(peak_err)} off the planned "
                       f"{storage_peak} B (tolerance {tol.peak_rel:.0%}){where}{why}")
    if first is not None:
        reasons.append(f"stage {i}: device bytes diverge from the prediction at event {first['position']} "
                       f"{first['kind']} '{first['op']}' (predicted {first['predicted_bytes']} B, measured "
                       f"{first['measured_bytes']} B; {len(diverged)} event(s) beyond {tol.event_rel:.0%} of the peak)")
    sizes = _size_mismatches(stage, records)
    for m in (m for m in sizes if abs(m["real_bytes"] - m["plan_bytes"]) > tol_bytes):
        reasons.append(f"stage {i}: op '{m['op']}' (storages {m['storages']}) holds {m['real_bytes']} B, "
                       f"the plan says {m['plan_bytes']} B")
    over_budget = counted_peak / budget - 1 if budget else None
    respected = over_budget is not None and over_budget <= tol.budget_over
    if not respected:
        host = f" (device {measured_peak} B and host copies in the same memory)" if counted_peak > measured_peak else ""
        reasons.append(f"stage {i}: measured peak {counted_peak} B{host} exceeds the budget {budget} B by "
                       f"{_pct(over_budget)} (tolerance {tol.budget_over:.0%}){why}")
    return reasons, {
        **_budget_fields(stage),
        "predicted_peak_bytes": planned_peak,
        "predicted_storage_peak_bytes": storage_peak,
        "measured_peak_bytes": measured_peak,
        "counted_peak_bytes": counted_peak,
        "peak_rel_err": peak_err,
        "budget_respected": respected,
        "over_budget_rel": over_budget,
        "host_peak_bytes": max(r.host_bytes for r in records),
    }, {"peak_event": peak_event, "first_divergence": first, "diverging_events": len(diverged),
        "size_mismatches": sizes[:10], "size_mismatch_count": len(sizes)}


def off_by_speed_drift(report: dict[str, Any], tol: Tolerances) -> bool:
    """Whether a stage's report fails its raw time check while its time at the host's speed now is within
    tolerance: its no-recompute run, timed beside it, was off its profiled time by less than ``load_rel`` (so not
    ``unreliable``) yet by enough to explain the miss. The validation times such a stage again before it reports the
    failure; a pass then rests on a raw time within tolerance, never on the adjusted one."""
    raw, adjusted = report.get("time_rel_err"), report.get("time_rel_err_load_adjusted")
    return raw is not None and adjusted is not None and abs(raw) > tol.time_rel >= abs(adjusted)


def _time_checks(stage: StagePlan, pred: Predicted, measured: StageTime,
                 tol: Tolerances) -> tuple[list[str], list[str], dict[str, Any]]:
    """Reasons the stage fails on its raw step time (median of the runs against the plan's time); reasons
    its time check is unreliable instead (the no-recompute run timed beside it off its profiled time by more
    than ``load_rel``: the machine is busy, and the raw error says nothing about the plan); and the time
    fields of the report, with the plan re-costed at this machine's speed now beside the raw figure."""
    i, stated_time = stage.index, float(stage.schedule["time"])
    time_s = measured.median_s
    time_err = _rel(time_s, stated_time)
    profiled = stage.problem.compute_time
    load = measured.baseline_s / profiled if profiled else None
    transfer_s = sum(s for s, (kind, _) in zip(pred.seconds, stage.events) if kind in ("swap_in", "swap_out"))

    def cost_now(baseline_s: float) -> float:
        """The plan re-costed at the load one baseline run shows and at the link measured now."""
        return baseline_s / profiled * (pred.time - transfer_s) + measured.link_scale * transfer_s

    now_s = statistics.median(cost_now(b) for b in measured.baseline_runs_s) if profiled else None
    adjusted_err = statistics.median(t / cost_now(b) - 1 for t, b in zip(measured.runs_s, measured.baseline_runs_s)) \
        if profiled else None
    raw_off = f"step time {time_s:.4f} s is {_pct(time_err)} off the planned {stated_time:.4f} s"
    reasons: list[str] = []
    unreliable: list[str] = []
    if load is not None and abs(load - 1) > tol.load_rel:
        unreliable.append(f"stage {i}: {raw_off}, but the machine is busy: its no-recompute run took {load:.2f}x its "
                          f"profiled time (tolerance {tol.load_rel:.0%}); at that speed the plan is "
                          f"{_pct(adjusted_err)} off")
    elif time_err is None or abs(time_err) > tol.time_rel:
        reasons.append(f"stage {i}: {raw_off} (tolerance {tol.time_rel:.0%}; no-recompute run at {load or 0:.2f}x "
                       f"its profiled time, transfers at x{measured.link_scale:.2f})")
    return reasons, unreliable, {
        "predicted_time_s": stated_time,
        "measured_time_s": time_s,
        "measured_time_runs_s": measured.runs_s,
        "time_rel_err": time_err,
        "communication_s": measured.communication_s,
        "no_recompute_predicted_s": profiled,
        "no_recompute_measured_s": measured.baseline_s,
        "load_factor": load,
        "predicted_transfer_s": transfer_s,
        "link_scale": measured.link_scale,
        "predicted_time_now_s": now_s,
        "time_rel_err_load_adjusted": adjusted_err,
    }


def stage_report(stage: StagePlan, records: list[EventRecord], pred: Predicted, measured: StageTime,
                 tol: Tolerances, *, host_shared: bool) -> dict[str, Any]:
    """One stage's predicted vs measured numbers, named mismatches, and its status: ``failed`` (with the
    reasons), ``unreliable`` (memory right, time measured on a busy machine) or ``passed``. ``host_shared``:
    host copies count toward the budget (:func:`_memory_checks`)."""
    mem_reasons, mem_fields, diagnosis = _memory_checks(stage, records, pred, tol, host_shared)
    time_reasons, unreliable, time_fields = _time_checks(stage, pred, measured, tol)
    reasons = mem_reasons + time_reasons
    sched = stage.schedule
    return {
        "index": stage.index,
        "status": "failed" if reasons else "unreliable" if unreliable else "passed",
        "reasons": reasons,
        "unreliable": unreliable,
        **mem_fields,
        **time_fields,
        "events": len(records),
        "recomputes": sched.get("recomputes"),
        "swap_ins": sched.get("swap_ins"),
        "swap_outs": sched.get("swap_outs"),
        **diagnosis,
    }
