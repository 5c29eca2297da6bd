"""The pipeline run's artifact: per-rank measurements (medians over the measured steps) beside the balance rule's
prediction for the schedule, and that prediction with the measured send/receive cost added."""

from __future__ import annotations

from dataclasses import asdict
from statistics import median
from typing import Any

from trainplan.budget import FIELDS
from trainplan.execute.plan import StagePlan
from trainplan.partition.pipeline import FORMULAS
from trainplan.pipeline.simulate import FORMULA, StageCosts, held_in_flight, recorded_orders, simulate
from trainplan.schedule.pipeline_hold import (carrier_bytes, copies_held, held_beside, held_gradient_bytes,
                                              in_flight, pending_gradient_sends, stash_bytes)

PREDICTION_FORMULAS = {
    "step_time_s": f"m * max_r sum_(s on r) t_s + (R - 1) * t_max over R ranks, each running v = k / R stages: "
                   f"at v = 1 {FORMULAS['gpipe_step_time_s']} (the balance rule's; 1F1B has the same bubble); "
                   "Interleaved1F1B's bubble is R - 1 stage slots",
    "comm_per_micro_batch_s": "rank r: its measured send_recv_s / m (the carriers of its stages for one "
                              "micro-batch, both directions, sent and received alone)",
    "step_time_with_comm_s": "m * max_r L_r + (R - 1) * max_s u_s + r, L_r = sum_(s on r) t_s + c_r and u_s = t_s + "
                             "c_r(s) / v, t_s the stage's scheduled time and c_r its rank's comm_per_micro_batch_s "
                             "(at v = 1: (m + k - 1) * max_s (t_s + c_s)): the balance rule's step with each slot "
                             "paying its transfers, which do not overlap compute (the schedules wait for a receive "
                             "before computing; on gloo the transfer runs on the rank's own cores); r: "
                             "tied_reduce_s",
    "tied_reduce_s": "the measured once-per-step reduction of tied parameters' partial gradients after the "
                     "schedule: the slowest rank's tied_receive_s (0 without tied parameters across stages)",
    "busy_s": "m * the stage's scheduled time (plan stages[i].schedule.time, one micro-batch forward+backward)",
    "idle_s": "step_time_s - busy_s",
    "peak_bytes": FORMULAS["rank_peak_bytes"] + " per stage (the run's schedule and m: carriers held for its "
                  "in-flight micro-batches)",
    "in_flight": "per stage, the most micro-batches whose forward ran and backward not yet: GPipe m, 1F1B "
                 "min(k - s, m), Interleaved1F1B what torch's order for the run's ranks holds (measured.in_flight: "
                 "the same read off the step's recorded order)",
}
MEASURED = {
    "step_s": "wall time of one schedule.step (after warm-up steps), this rank; the run's: the median over the "
              "measured steps of the slowest rank's time in each; every per-rank number: its median over them",
    "compute_s": "wall time in PipelineStage.forward_one_chunk and backward_one_chunk (the stage's halves, "
                 "autograd's gradient accumulation), summed over micro-batches",
    "forward_half_s": "of which in the stage's planned forward half (carriers packed and unpacked included)",
    "backward_half_s": "of which in its planned backward half",
    "send_recv_s": "this rank's time sending and receiving one step's carriers alone, link by link after a "
                   "barrier (transfer without waiting for a peer)",
    "tied_send_s": "in the step, after the schedule: sending the tied parameters' partial gradients this rank summed "
                   "over the micro-batches (from its own schedule end: waiting for the receiver included)",
    "tied_receive_s": "in the step, after the schedule: receiving tied partial gradients and adding them, scaled "
                      "by 1/m, into this rank's parameters' gradients",
    "idle_s": "step_s - compute_s - send_recv_s: waiting for a peer (the bubble), the schedule's own work and the "
              "tied reduction",
    "alone": "forward_s and backward_s of one micro-batch through this stage with no other stage computing "
             "(GPipe steps of one micro-batch after the measured steps), medians over as many steps as repeats",
    "transfer_s": "seconds per carrier on each link this rank is on, per direction (from send_recv_s's timings)",
    "in_flight": "per stage, the most micro-batches whose forward ran and backward had not in the recorded order of "
                 "the median step (the prediction's: from the schedule's declared order)",
    "over_simulated": "step_s / simulated.step_time_s: the schedule's own action order with this run's stage and "
                      "transfer costs",
    "co_run_slowdown": "per rank: compute_s / (m * (alone forward_s + backward_s)): how much slower the stage "
                       "computed a micro-batch inside the pipeline, its peers computing beside it, than alone (ranks "
                       "sharing a host's cores and caches); the prediction assumes 1",
    "peak_bytes": "the most the rank's memory rose above what it held before the step, its gradients cleared: the "
                  "median of as many metered steps as repeats (each in peak_bytes_readings) after the timed ones "
                  "and one unread metered step (the meter thread's first step allocates the BLAS buffers it then "
                  "keeps): on the CPU with freed memory returned to the system so that resident memory tracks "
                  "what is held (the timed steps keep the heap's pages, as the profile does; the metered steps' "
                  "median time, metered_step_s, pays a page fault per 4 KiB allocated)",
    "memory": "per rank: the stage's rank_budget_bytes (the cap of the rank, the in-flight stashes of the "
              "schedule it was planned for and its gradient sums held: the requested one, or where the status is "
              "raised the least reachable; plans made before ranks had their own budget: budget_bytes), "
              "predicted_peak_bytes (prediction.peak_bytes), "
              "measured_peak_bytes = what the rank held before the step, the plan's fixed_bytes (parameters and "
              "inputs) and receive_buffer_bytes (PipelineStage's receive buffers, one per micro-batch and received "
              "tensor, read off its stages), + peak_bytes (everything the process holds), "
              "measured_tensor_peak_bytes the same with "
              "tensor_peak_bytes (torch's allocator: what the plan accounts for), status the rank's (met, or "
              "raised to its predicted peak), within_budget = measured <= budget and tensors_within_budget; "
              "planned_for: the schedule and m the stage's budget holds in flight, planned_for_run whether that "
              "budget holds what this run has in flight (the same in-flight count and gradient sums, no more "
              "micro-batches: a 1F1B plan run under GPipe holds m stashes where it planned min(k - s, m); under a "
              "multi-stage schedule the in-flight counts read off the run's order); with several stages per rank "
              "budget, fixed and predicted bytes are its stages' summed (each stage's predicted peak bounds what "
              "it holds at any moment, so their sum bounds the rank's)",
    "tensor_peak_bytes": "the most torch's allocator held above the step's start in one more metered step (on the "
                         "CPU from the profiler's memory events; on CUDA peak_bytes itself)",
    "timeline": "each rank's compute calls (F: forward, B: backward of a micro-batch) in the measured step whose "
                "time is the median, seconds from the rank's own step start (the ranks start together after a "
                "barrier)",
}


def rank_numbers(steps: list[dict[str, Any]], links: list[float]) -> dict[str, Any]:
    """One rank's numbers over its timed ``steps`` (measured_step's) and send/receive timings: medians, each
    step's time and compute calls (the peak comes from the metered step apart)."""
    out: dict[str, Any] = {key: median(s[key] for s in steps) for key in (
        "step_s", "compute_s", "forward_half_s", "backward_half_s", "tied_send_s", "tied_receive_s")}
    out["send_recv_s"] = median(links)
    out["idle_s"] = out["step_s"] - out["compute_s"] - out["send_recv_s"]
    out["step_s_repeats"] = [s["step_s"] for s in steps]
    out["actions_repeats"] = [s["actions"] for s in steps]
    return out


def transfer_medians(repeats: list[dict[str, list[float | None]]]) -> dict[str, list[float | None]]:
    """Per direction and link, the median over repeats of one carrier's seconds (None where the rank is not on it)."""
    return {direction: [None if per[0] is None else median(per)
                        for per in zip(*(r[direction] for r in repeats))] for direction in ("forward", "backward")}


def simulated(stages: list[dict[str, Any]], ranks: list[dict[str, Any]],
              timeline: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """The schedule's step simulated (trainplan.pipeline.simulate) in the order ``timeline``'s step ran, from this
    run's costs: each stage's forward and backward alone, and per link and direction the slower endpoint's
    seconds per carrier; plus the measured tied reduction after it."""
    def link(direction: str, s: int) -> float:
        return max(r["transfer_s"][direction][s] for r in ranks if r["transfer_s"][direction][s] is not None)

    k = len(stages)
    costs = StageCosts([st["alone"]["forward_s"] for st in stages], [st["alone"]["backward_s"] for st in stages],
                       [link("forward", s) for s in range(k - 1)], [link("backward", s) for s in range(k - 1)])
    out = simulate(recorded_orders(timeline), costs)
    reduce = tied_reduce_seconds(ranks)
    return {**out, "step_time_s": out["step_time_s"] + reduce, "costs": {**asdict(costs), "tied_reduce_s": reduce},
            "formula": FORMULA + "; plus tied_reduce_s after the schedule"}


def tied_reduce_seconds(ranks: list[dict[str, Any]]) -> float:
    """The once-per-step tied reduction's cost: the slowest receiving rank's receive-and-add time."""
    return max(r["tied_receive_s"] for r in ranks)


def rank_stages(k: int, ranks: int) -> list[list[int]]:
    """The stages of each of ``ranks`` ranks running a ``k``-stage plan: stage s on rank s mod ranks."""
    return [list(range(r, k, ranks)) for r in range(ranks)]


def with_communication(predicted: dict[str, Any], send_recv_s: list[float], m: int,
                       tied_reduce_s: float = 0.0) -> dict[str, Any]:
    """``predicted`` with each rank's measured send/receive cost per micro-batch (``send_recv_s``, rank order)
    added to its slots and the tied reduction once (PREDICTION_FORMULAS['step_time_with_comm_s'])."""
    times = predicted["stage_times_s"]
    on = rank_stages(len(times), len(send_recv_s))
    v = len(on[0])
    comm = [s / m for s in send_recv_s]
    load = max(sum(times[s] for s in stages) + c for stages, c in zip(on, comm))
    slot = max(times[s] + c / v for stages, c in zip(on, comm) for s in stages)
    return {**predicted, "comm_per_micro_batch_s": comm, "tied_reduce_s": tied_reduce_s,
            "step_time_with_comm_s": m * load + (len(on) - 1) * slot + tied_reduce_s}


def prediction(data: dict[str, Any], stages: list[StagePlan], schedule: str, m: int, ranks: int,
               links: list[tuple[int, int]] | None = None) -> dict[str, Any]:
    """The balance rule's numbers for ``schedule`` with ``m`` micro-batches on ``ranks`` ranks, from the plan's
    per-stage times, schedule peaks, the bytes each schedule holds at its split, the gradients each stage sums,
    and its carriers (``links``: each stage's carrier bytes out and in as run; default the plan's, tied partials
    sent once per step)."""
    k = len(stages)
    times = [float(st.schedule["time"]) for st in stages]
    peaks = [int(st.schedule["peak_bytes"]) for st in stages]
    problems = [data["stages"][i]["problem"] for i in range(k)]
    stash = [stash_bytes(pr, st.schedule["events"]) for pr, st in zip(problems, stages)]
    sums = [held_gradient_bytes(pr, m) for pr in problems]
    n = [in_flight(s, k, m, schedule, k // ranks) for s in range(k)]  # micro-batches in flight
    pending = [pending_gradient_sends(s, k, m, schedule, k // ranks) for s in range(k)]
    links = links or [carrier_bytes(pr) for pr in problems]
    carriers = [copies_held(pr, i, m, schedule, link) for pr, i, link in zip(problems, n, links)]
    t_max = max(times)
    step = m * max(sum(times[s] for s in on) for on in rank_stages(k, ranks)) + (ranks - 1) * t_max
    peak = [p + held_beside(g, c, i, a, q, link[1])
            for p, a, g, c, i, q, link in zip(peaks, stash, sums, carriers, n, pending, links)]
    return {"stage_times_s": times, "t_max_s": t_max, "step_time_s": step,
            "busy_s": [m * t for t in times], "idle_s": [step - m * t for t in times],
            "schedule_peak_bytes": peaks, "stash_bytes": stash, "gradient_sum_bytes": sums, "carrier_bytes": carriers,
            "pending_gradient_sends": pending,
            "in_flight": n, "peak_bytes": peak,
            "formulas": PREDICTION_FORMULAS}


def planned_for(stage: dict[str, Any]) -> dict[str, Any] | None:
    """The schedule and micro-batch count a plan's stage was budgeted for (None: planned alone, no pipeline)."""
    hold = stage.get("problem", {}).get("pipeline")
    return None if hold is None else {"schedule": hold.get("schedule", "1f1b"), "micro_batches": hold["micro_batches"],
                                      "stages_per_rank": hold.get("stages_per_rank", 1)}


def holds_run(stages: list[dict[str, Any]], schedule: str, m: int, counts: list[int] | None = None) -> list[bool]:
    """Per stage of a plan, whether its budget holds what the stage holds in a run of ``schedule`` with ``m``
    micro-batches: as many micro-batches in flight as it was planned for, gradients summed across micro-batches
    alike, and no more micro-batches than planned (the last stage holds each one's loss). A 1F1B plan made for m
    holds 1F1B runs with k <= m' <= m; a GPipe plan only its own m. ``counts``: the run's in-flight micro-batches
    per stage (default: the schedule's with one stage per rank). Stages sharing a rank share its budget, theirs
    summed: each stage within its own bounds the rank."""
    k, out = len(stages), []
    counts = counts or [in_flight(i, k, m, schedule) for i in range(k)]
    for i, stage in enumerate(stages):
        hold = planned_for(stage)
        planned = None if hold is None else stage["problem"]["pipeline"].get("in_flight") or in_flight(
            i, k, hold["micro_batches"], hold["schedule"], hold["stages_per_rank"])
        out.append(hold is not None and m <= hold["micro_batches"] and (m > 1) == (hold["micro_batches"] > 1)
                   and counts[i] == planned)
    return out


def memory_check(data: dict[str, Any], ranks: list[dict[str, Any]], predicted: dict[str, Any], schedule: str,
                 m: int, counts: list[int] | None = None) -> list[dict[str, Any]]:
    """Each rank's measured peak, counting what it held before the step (its stages' fixed bytes), against its
    stages' budgets and the predicted peaks with the run's ``schedule`` and ``m`` (``counts`` in flight per stage),
    summed over its stages (MEASURED['memory'])."""
    out, holds = [], holds_run(data["stages"], schedule, m, counts)
    for r in ranks:
        on = r["stages"]
        plans = [data["stages"][i] for i in on]

        def total(values: list[Any]) -> int | None:
            return None if any(x is None for x in values) else sum(int(x) for x in values)

        fixed = total([st.get("fixed_bytes") for st in plans])
        budget = total([st.get("rank_budget_bytes", st.get("budget_bytes")) for st in plans])
        predicted_peak = total([predicted["peak_bytes"][i] for i in on]) if predicted["peak_bytes"] else None
        held = None if fixed is None else fixed + int(r["receive_buffer_bytes"])  # held before the step
        measured = None if r["peak_bytes"] is None or held is None else held + int(r["peak_bytes"])
        tensors = None if r.get("tensor_peak_bytes") is None or held is None else held + int(r["tensor_peak_bytes"])
        statuses = [st.get("rank_status", st.get("status")) for st in plans]
        out.append({"rank": r["rank"], "stages": on,
                    "status": statuses[0] if len(set(statuses)) == 1 else ",".join(map(str, statuses)),
                    "budget_bytes": budget, "fixed_bytes": fixed,
                    "receive_buffer_bytes": int(r["receive_buffer_bytes"]), "predicted_peak_bytes": predicted_peak,
                    "measured_peak_bytes": measured, "measured_tensor_peak_bytes": tensors,
                    "planned_for": planned_for(plans[0]) if len(plans) == 1 else [planned_for(st) for st in plans],
                    "planned_for_run": all(holds[i] for i in on),
                    "within_budget": None if measured is None or budget is None else measured <= budget,
                    "tensors_within_budget": None if tensors is None or budget is None else tensors <= budget})
    return out


def median_repeat(ranks: list[dict[str, Any]]) -> tuple[int, list[float]]:
    """The measured step whose slowest rank's time is the median (the lower one of an even count), and each
    step's slowest time."""
    slowest = [max(times) for times in zip(*(r["step_s_repeats"] for r in ranks))]
    order = sorted(range(len(slowest)), key=slowest.__getitem__)
    return order[(len(order) - 1) // 2], slowest


def co_run_slowdown(rank: dict[str, Any], stages: list[dict[str, Any]], m: int) -> float | None:
    """The rank's compute time per micro-batch in the pipeline over its stages' forwards and backwards alone."""
    alone = sum(stages[s]["alone"]["forward_s"] + stages[s]["alone"]["backward_s"] for s in rank["stages"])
    return rank["compute_s"] / (m * alone) if alone > 0 else None


def artifact(settings: Any, data: dict[str, Any], ranks: list[dict[str, Any]], plans: list[StagePlan], *,
             device: str, backend: str, memory: str) -> dict[str, Any]:
    """The run's record: settings, per-rank numbers (rank order; each rank's stages listed by index), per-stage
    numbers (stage order), the combined loss, the balance rule's prediction with and without the measured
    send/receive cost, the schedule simulated from this run's measured stage and transfer costs, and the median
    step's timeline."""
    stages = sorted((st for r in ranks for st in r["stages"]), key=lambda st: st["stage"])
    for r in ranks:
        r["stages"] = [st["stage"] for st in r["stages"]]
    losses = next(r for r in ranks if len(plans) - 1 in r["stages"])["losses"]
    chosen, slowest = median_repeat(ranks)
    timeline = [r.pop("actions_repeats")[chosen] for r in ranks]
    m = settings.micro_batches
    predicted = prediction(data, plans, settings.schedule, m, len(ranks),
                           [(st["carrier_out_bytes"], st["carrier_in_bytes"]) for st in stages])
    held = held_in_flight(recorded_orders(timeline), len(plans))
    predicted = with_communication(predicted, [r["send_recv_s"] for r in ranks], m, tied_reduce_seconds(ranks))
    step = median(slowest)
    simulation = simulated(stages, ranks, timeline)
    out = {
        "model": settings.model,
        "plan": str(settings.plan),
        "k": len(plans),
        "world_size": len(ranks),
        "stages_per_rank": len(plans) // len(ranks),
        **{key: data.get(key) for key in FIELDS},
        "schedule": settings.schedule,
        "micro_batches": settings.micro_batches,
        "device": device,
        "backend": backend,
        "threads_per_rank": settings.threads,
        "tied_grads": settings.tied_grads,
        "warmup_steps": settings.warmup,
        "repeats": settings.repeats,
        "malloc": memory,
        "loss": sum(losses) / len(losses),
        "losses": losses,
        "measured": {"step_s": step, "step_s_repeats": slowest,
                     "over_predicted": step / predicted["step_time_s"] if predicted["step_time_s"] > 0 else None,
                     "over_predicted_with_comm": step / predicted["step_time_with_comm_s"]
                     if predicted["step_time_with_comm_s"] > 0 else None,
                     "over_simulated": step / simulation["step_time_s"] if simulation["step_time_s"] > 0 else None,
                     "co_run_slowdown": [co_run_slowdown(r, stages, m) for r in ranks],
                     "in_flight": held,
                     "definitions": MEASURED},
        "ranks": ranks,
        "stages": stages,
        "timeline": {"repeat": chosen, "step_s": slowest[chosen], "ranks": timeline},
        "prediction": predicted,
        "simulated": simulation,
        "memory": memory_check(data, ranks, predicted, settings.schedule, m, held),
    }
    if all("check" in r for r in ranks):
        out["check"] = {"planned_bit_identical": all(r["check"]["planned"]["bit_identical"] for r in ranks),
                        "eager_close": all(r["check"]["eager"]["close"] for r in ranks),
                        "tied_reduced_close": all(r["check"]["planned"]["tied_reduced_close"] for r in ranks)}
    return out
