"""Validate a plan on the real model: execute it, measure it, compare it with its prediction."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from trainplan.budget import Budget
from trainplan.errors import ArtifactError
from trainplan.execute.check import compare_outputs
from trainplan.execute.compile import Probe, clocked_run, compile_plan, probe_run
from trainplan.execute.diagnose import StageTime, Tolerances, off_by_speed_drift, stage_report
from trainplan.execute.layout import GraphLayout, stage_layouts
from trainplan.execute.measure import Peaks, measure_peaks, time_runs
from trainplan.execute.plan import PlanError, StagePlan, sums_in_place
from trainplan.execute.predict import predict
from trainplan.execute.runner import ExecutionError, RunResult, run_plan
from trainplan.export.tables import graph_tables
from trainplan.export.trace import TracedStep, make_step_fn, trace_training_step
from trainplan.memory_model import MemoryModel, memory_model
from trainplan.models import BuiltModel, on_device
from trainplan.numerics import EXACT_FP32, exact_fp32
from trainplan.profile.link import LinkMeasurement, measure_host_link
from trainplan.schedule import solve
from trainplan.timing import keep_freed_memory, return_freed_memory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValidateSettings:
    """Timing repetitions (after ``warmup``), the device to execute on and its host memory (``shared`` or
    ``separate``; None: by device type, ``memory_model.memory_model``), the pass tolerances, whether to meter the
    whole run's peaks (allocator and process) and check them against the budget, and how many times to time
    the plan while the machine is busy."""

    repeats: int = 3
    warmup: int = 1
    device: str = "cpu"
    tolerances: Tolerances = field(default_factory=Tolerances)
    allocator_check: bool = True
    attempts: int = 3  # timings taken at most, while the machine is busy (a stage's time check unreliable) or a
    # stage misses its time by no more than the host's speed moved (diagnose.off_by_speed_drift)
    host_memory: str | None = None


@dataclass
class Validation:
    """The validation document (JSON) and the per-event timeline (predicted vs measured bytes and time)."""

    report: dict[str, Any]
    timeline: pd.DataFrame


def _check_graph(traced: TracedStep, stages: list[StagePlan], export_names: list[str] | None) -> None:
    names = [n.name for n in traced.gm.graph.nodes if n.op == "call_function"]
    if export_names is not None and names != export_names:
        raise ArtifactError(f"model '{traced.model}': the traced graph ({len(names)} ops) differs from the exported "
                            f"one ({len(export_names)} ops); re-run the export for this device and torch version")
    known = set(names)
    for st in stages:
        unknown = [n for n in st.nodes if n not in known]
        if unknown:
            raise PlanError(f"stage {st.index} names fx node(s) {unknown[:3]} that the traced graph lacks")


def _references(built: BuiltModel, traced: TracedStep, flat: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The unmodified compiled step (``traced.gm``) and the eager autograd step on the same inputs."""
    with torch.no_grad():
        compiled = [t.detach().clone() for t in traced.gm(*flat)]
    step = make_step_fn(built, traced.param_names, traced.buffer_names, traced.batch_names)
    n_params = len(traced.param_names)
    inputs = [t.detach().clone().requires_grad_(i < n_params) for i, t in enumerate(flat)]
    eager = [t.detach() for t in step(*inputs)]
    return compiled, eager


def _timeline(stages: list[StagePlan], measured: RunResult, probe: Probe) -> pd.DataFrame:
    preds = {st.index: predict(st.problem, st.events) for st in stages}
    rows = []
    for rec, (_, _, compiled_bytes, _) in zip(measured.records, probe.after):
        p = preds[rec.stage]
        rows.append({"stage": rec.stage, "position": rec.position, "kind": rec.kind, "op": rec.op,
                     "predicted_bytes_after": p.bytes_after[rec.position], "predicted_bytes_peak": p.bytes_peak[rec.position],
                     "predicted_storage_bytes_peak": p.storage_peak[rec.position],
                     "measured_bytes_after": rec.bytes_after, "measured_bytes_peak": rec.bytes_peak,
                     "compiled_bytes_after": compiled_bytes, "host_bytes": rec.host_bytes,
                     "predicted_s": p.seconds[rec.position]})
    return pd.DataFrame(rows)


def compare_compiled(measured: RunResult, probe: Probe) -> list[str]:
    """Events where the compiled plan holds other storages or device bytes than the interpreter (first 5)."""
    out = []
    for rec, (stage, pos, nbytes, sids) in zip(measured.records, probe.after):
        if (rec.stage, rec.position) != (stage, pos) or sids != rec.storages or nbytes != rec.bytes_after:
            out.append(f"stage {rec.stage} event {rec.position} {rec.kind} '{rec.op}': compiled holds storages "
                       f"{sorted(sids ^ rec.storages)[:5]} differently, {nbytes} B vs {rec.bytes_after} B interpreted")
    if len(probe.after) != len(measured.records):
        out.append(f"the compiled plan ran {len(probe.after)} events, the interpreter {len(measured.records)}")
    return out[:5]


def _host_link_now(stages: list[StagePlan], dev: torch.device, settings: ValidateSettings,
                   link_sizes: list[int] | None) -> LinkMeasurement | None:
    """The host link measured in this process (None if no plan swaps a byte): on ``link_sizes``, the
    transfers the profile timed, so that the ratio to the profile's bandwidth is the machine's drift alone;
    without them, on the sizes the plans swap."""
    sizes = [op.bytes for st in stages for kind, oid in st.events if kind == "swap_out"
             for op in [st.problem.ops[st.problem.index[oid]]]]
    if not any(size > 0 for size in sizes):
        return None
    return measure_host_link(dev, link_sizes or sizes, repeats=settings.repeats, warmup=settings.warmup)


def validate_plan(built: BuiltModel, plan: dict[str, Any], stages: list[StagePlan], tensors: pd.DataFrame, *,
                  export_names: list[str] | None = None, settings: ValidateSettings = ValidateSettings(),
                  link_sizes: list[int] | None = None) -> Validation:
    """Execute every stage's schedule on ``built``'s real training step and compare it with the plan, with
    fp32 exact and deterministic kernels (``exact_fp32``), as the profile ran. ``link_sizes``: the
    transfer sizes the profile measured the host link on (its summary's ``host_link.sizes``), timed again
    here to re-cost the plan's transfers.

    Memory is measured by the event interpreter (``run_plan``), and the plan compiled into code
    (``compile_plan``) is checked against it event by event; time is measured on the compiled plan, with the
    no-recompute plan compiled and timed alternately with it. A plan whose stage has no schedule, or whose
    measurements fall outside ``settings.tolerances``, is reported ``failed`` with the reasons; one whose
    memory checks pass but whose time was measured while the machine was busy (after ``settings.attempts``
    timings) is reported ``unreliable``; an unreadable plan raises PlanError before this point. A stage that
    misses its time by no more than the host's speed moved is timed again too (up to ``settings.attempts``):
    the verdict is the last timing's.

    The budget counts what the device's memory model says (``settings.host_memory``): each stage's storages,
    plus its host copies where host memory is shared; and the whole run's peak at the level that counts
    everything (:meth:`Peaks.counted`: the process's on the CPU). Memory is metered with freed host memory
    returned to the system (``return_freed_memory``), then kept for the timing and the rest of the process
    (``keep_freed_memory``), as the profile does.
    """
    with exact_fp32():
        return _validate(built, plan, stages, tensors, export_names, settings, link_sizes)


def _validate(built: BuiltModel, plan: dict[str, Any], stages: list[StagePlan], tensors: pd.DataFrame,
              export_names: list[str] | None, settings: ValidateSettings, link_sizes: list[int] | None) -> Validation:
    tol, dev = settings.tolerances, torch.device(settings.device)
    model = memory_model(dev.type, settings.host_memory)
    host_allocator = {"metering": return_freed_memory()}
    head = {"model": built.name, "device": plan.get("device", settings.device), "k": len(stages),
            **Budget.of_fields(plan).fields(), "memory_model": model.to_dict(),
            "tolerances": tol.to_dict(),
            "settings": {"repeats": settings.repeats, "warmup": settings.warmup, "device": settings.device,
                         "threads": torch.get_num_threads(), "torch": torch.__version__,
                         "numerics": EXACT_FP32, "host_allocator": host_allocator}}
    missing = [st for st in stages if not st.executable]
    if missing:
        reasons = [f"stage {st.index}: no schedule to execute (status {st.schedule.get('status')}: "
                   f"{st.schedule.get('note', '')})" for st in missing]
        return Validation({**head, "status": "failed", "reasons": reasons, "stages": []}, pd.DataFrame())
    built = on_device(built, dev)
    in_place = sums_in_place(stages)
    traced, flat = trace_training_step(built, sums_in_place=in_place)
    _check_graph(traced, stages, export_names)
    if not in_place:  # a pipeline's stages: the exported tables made functional, as this trace's
        tensors = graph_tables(traced).tensors
    flat = [t.detach().to(dev) for t in flat]
    gm = traced.gm.to(dev)
    compiled_ref, eager = _references(built, traced, flat)
    layout = GraphLayout.build(gm, flat, tensors)
    layouts = stage_layouts(stages, layout)
    events = [st.events for st in stages]
    base_events = [solve(st.problem, method="no_recompute").events for st in stages]

    log.info("measured run: %d events over %d stage(s)", sum(map(len, events)), len(stages))
    try:
        measured = run_plan(layouts, events, layout, gm, device=dev, measure=True)
        compiled = compile_plan(gm, layout, layouts, events, device=dev, clocked=True)
        baseline = compile_plan(gm, layout, layouts, base_events, device=dev, clocked=True)
        probed = compile_plan(gm, layout, layouts, events, device=dev, probe=True)
    except ExecutionError as exc:
        return Validation({**head, "status": "failed", "reasons": [f"not executable: {exc}"], "stages": []},
                          pd.DataFrame())
    probe_outputs, probe = probe_run(probed, layout, layouts, flat)
    compiled_mismatch = compare_compiled(measured, probe)
    names = ["loss", *traced.param_names]
    vs_compiled = compare_outputs(list(probe_outputs), compiled_ref, names, rtol=tol.grad_rtol, atol=tol.grad_atol)
    vs_eager = compare_outputs(list(probe_outputs), eager, names, rtol=tol.grad_rtol, atol=tol.grad_atol)
    vs_interpreted = compare_outputs(list(probe_outputs), measured.outputs, names, rtol=0.0, atol=0.0)
    del probe_outputs, measured.outputs[:]
    start_bytes = sum(st.nbytes() for st in {id(t.untyped_storage()): t.untyped_storage() for t in flat}.values())
    storage_peak = max(r.bytes_peak for r in measured.records)
    peaks = measure_peaks(lambda: compiled(*flat), dev, start_bytes) if settings.allocator_check else None
    # what fails the plan whatever its timing says: the whole run's memory, the gradients, compiled vs interpreted
    untimed_reasons, memory = _whole_run_memory(peaks, model, stages, storage_peak, tol)
    if not vs_compiled.within_tolerance:
        untimed_reasons.append(f"gradients differ from the unmodified step: max abs error "
                               f"{vs_compiled.max_abs_err:.3g}, max rel error {vs_compiled.max_rel_err:.3g} at "
                               f"'{vs_compiled.worst_output}'")
    if not vs_interpreted.bit_exact:
        untimed_reasons.append(f"the compiled plan's loss/gradients differ from the interpreter's: max abs error "
                               f"{vs_interpreted.max_abs_err:.3g} at '{vs_interpreted.worst_output}'")
    untimed_reasons += [f"compiled vs interpreted: {m}" for m in compiled_mismatch]
    host_allocator["timing"] = keep_freed_memory()
    link_now = _host_link_now(stages, dev, settings, link_sizes)
    for attempt in range(1, max(1, settings.attempts) + 1):
        log.info("timing (attempt %d): %d warm-up + %d runs of the compiled plan", attempt, settings.warmup,
                 settings.repeats)
        timings = time_runs(lambda: clocked_run(compiled, flat, dev), lambda: clocked_run(baseline, flat, dev),
                            len(stages), repeats=settings.repeats, warmup=settings.warmup)
        reports = []
        for pos, st in enumerate(stages):
            recs = [r for r in measured.records if r.stage == st.index]
            times = StageTime(timings.stage_runs[pos], timings.baseline_runs[pos], timings.communication_median(pos),
                              st.problem.bandwidth / link_now.bytes_per_s if link_now else 1.0)
            reports.append(stage_report(st, recs, predict(st.problem, st.events), times, tol,
                                        host_shared=model.host_memory == "shared"))
        busy = [u for rep in reports for u in rep["unreliable"]]
        drifted = [f"stage {rep['index']} {rep['time_rel_err']:+.1%} off its planned time, "
                   f"{rep['time_rel_err_load_adjusted']:+.1%} at the host's speed now"
                   for rep in reports if off_by_speed_drift(rep, tol)]
        # timed again only where a timing can change the verdict: a drifted stage's time miss its only reason
        decided = untimed_reasons or sum(len(rep["reasons"]) for rep in reports) > len(drifted)
        if not busy and (not drifted or decided):
            break
        log.warning("attempt %d: %s", attempt, f"the machine is busy: {busy[0]}" if busy else
                    f"the host's speed moved: {drifted[0]}; timing again")
    reasons = [r for rep in reports for r in rep["reasons"]] + untimed_reasons
    report = {
        **head,
        "status": "failed" if reasons else "unreliable" if busy else "passed",
        "reasons": reasons,
        "unreliable": busy,
        "timing_attempts": attempt,
        "gradients": {"vs_compiled_step": vs_compiled.to_dict(), "vs_eager_autograd": vs_eager.to_dict(),
                      "vs_interpreter": vs_interpreted.to_dict()},
        "memory": memory,
        "unplanned": {"views_that_allocated": sorted(measured.shared.surprises),
                      "regenerated_ops": sorted(set(measured.shared.regenerated))},
        "compiled_vs_interpreted": {"events": len(probe.after), "mismatches": compiled_mismatch},
        "timing": {"page_faults_per_run": timings.page_faults,
                   "baseline_page_faults_per_run": timings.baseline_page_faults,
                   "host_link_now": {**link_now.to_dict(), "sizes_from": "profile" if link_sizes else "plan swaps"}
                   if link_now else None},
        "predicted_time_s": sum(r["predicted_time_s"] for r in reports),
        "measured_time_s": sum(r["measured_time_s"] for r in reports),
        "stages": reports,
    }
    return Validation(report, _timeline(stages, measured, probe))


def _whole_run_memory(peaks: Peaks | None, model: MemoryModel, stages: list[StagePlan], storage_peak: int,
                      tol: Tolerances) -> tuple[list[str], dict[str, Any]]:
    """The whole compiled run's peaks beside the interpreter's storage peak, the one the budget counts under
    ``model`` against the stages' budgets together (they run in one process; with k > 1 a weaker check than
    each stage's own), and the reason it fails where it passes them by more than the meter's tolerance."""
    budget = sum(st.budget_bytes for st in stages)
    out: dict[str, Any] = {"storage_peak_bytes_all_stages": storage_peak, "budget_bytes": budget}
    if peaks is None:
        return [], {**out, "counted": None, "peak_bytes_counted": None, "budget_respected": None}
    name, counted = peaks.counted(model)
    slack = tol.meter_slack_bytes(budget)
    respected = None if counted is None else counted <= budget + slack
    out.update(peaks.to_dict(), counted=name, peak_bytes_counted=counted, budget_respected=respected,
               over_budget_rel=None if counted is None else counted / budget - 1, tolerance_bytes=slack,
               allocator_over_storage_rel=peaks.allocator / storage_peak - 1 if peaks.allocator else None)
    if respected is False:
        return [f"the whole run held {counted} B at most ({name}), {counted / budget - 1:+.1%} over the stages' "
                f"budget {budget} B, beyond the meter's tolerance ({slack} B: {tol.meter_rel:.0%} + "
                f"{tol.meter_abs_mib:g} MiB): memory the plan does not count (host copies in shared memory, "
                f"kernel workspaces, allocator rounding)"], out
    return [], out
