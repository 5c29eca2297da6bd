"""Seed steps 7-8: schedule every stage under its budget, rate the balance, re-partition while the rate
is below the threshold and improving; compare with the exact min-max DP partition (PipeDream)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainplan.partition.graph import PipelineGraph
from trainplan.partition.memory_limit import MemoryLimit
from trainplan.partition.partition import Partition, cuts_bottleneck, partition_graph
from trainplan.partition.pipeline import FORMULAS, PipelineMetrics, pipeline_metrics
from trainplan.partition.refine import total_boundary_bytes
from trainplan.partition.schedule_cache import ScheduledStage, StageScheduler
from trainplan.partition.split import min_max_cuts
from trainplan.partition.stages import StageStats, stage_index, stage_stats
from trainplan.partition.tables import RangeTables
from trainplan.schedule.pipeline_hold import stash_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BalanceSettings:
    threshold: float  # stop once t_min / t_max reaches this
    max_iterations: int  # partitions scheduled at most, the first included
    micro_batches: int
    tolerance: float  # refinement may raise the bottleneck weight by this fraction
    schedule: str = "1f1b"  # the pipeline schedule whose in-flight micro-batches each rank's budget holds


@dataclass
class Evaluated:
    """One partition with every stage scheduled."""

    cuts: tuple[int, ...]
    stages: list[StageStats]
    scheduled: list[ScheduledStage]
    metrics: PipelineMetrics
    boundary_bytes: int

    @property
    def times(self) -> list[float]:
        return [float(s.schedule.time) for s in self.scheduled]

    def summary(self) -> dict[str, Any]:
        """Everything but the problems and events: what an iteration artifact keeps."""
        return {
            "cuts": list(self.cuts),
            "boundary_bytes": self.boundary_bytes,
            **self.metrics.to_dict(),
            "stages": [{**_stage_numbers(st, sc, peak), "nodes": st.nodes}
                       for st, sc, peak in zip(self.stages, self.scheduled, self.metrics.rank_peak_bytes)],
        }


def _stage_numbers(st: StageStats, sc: ScheduledStage, rank_peak: int) -> dict[str, Any]:
    """A stage's numbers; ``rank_peak``: its rank's peak with its hold's in-flight micro-batches
    (``PipelineMetrics.rank_peak_bytes``)."""
    sched = sc.schedule
    hold = sc.problem.get("pipeline") or {}
    requested = int(hold.get("rank_budget_bytes", sched.budget_bytes))
    return {
        "index": st.index,
        "time_s": sched.time,
        "compute_time_s": st.time_s,
        "forward_time_s": st.forward_time_s,
        "backward_time_s": st.backward_time_s,
        "overhead": sched.time / st.time_s if st.time_s > 0 else 1.0,
        "activation_bytes": st.activation_bytes,
        "boundary_in_bytes": st.boundary_in_bytes,
        "boundary_out_bytes": st.boundary_out_bytes,
        "fixed_bytes": st.fixed_bytes,
        "budget_bytes": sched.budget_bytes,
        "peak_bytes": sched.peak_bytes,
        "stash_bytes": schedule_stash(sc),
        "gradient_sum_bytes": int(hold.get("gradient_sum_bytes", 0)),
        "carrier_bytes": int(hold.get("carrier_bytes", 0)),
        # the rank's budget (its in-flight stashes and gradient sums held): the requested one where the rank's
        # peak with this schedule's own stash is within it, else raised to that peak (the least found)
        "rank_budget_bytes": max(requested, rank_peak),
        "rank_status": "met" if rank_peak <= requested else "raised",
        "status": sched.status,
        "note": sched.extra.get("note"),
    }


@dataclass
class Balanced:
    """Every iteration (its partition and schedules), the chosen one, and the DP partition scheduled."""

    partitions: list[Partition]
    iterations: list[Evaluated]
    chosen: int
    stop_reason: str
    dp: Evaluated
    dp_bottleneck_s: float  # the DP's optimum of the profiled bottleneck

    @property
    def final(self) -> Evaluated:
        return self.iterations[self.chosen]


def evaluate(graph: PipelineGraph, tables: RangeTables, cuts: tuple[int, ...], scheduler: StageScheduler,
             micro_batches: int) -> Evaluated:
    """Schedule every stage of ``cuts`` and compute the pipeline metrics."""
    stages = stage_stats(graph, cuts)
    scheduled = [scheduler(s.index, s.nodes) for s in stages]
    holds = [x.problem.get("pipeline") or {} for x in scheduled]
    metrics = pipeline_metrics([float(x.schedule.time) for x in scheduled],
                               [int(x.schedule.peak_bytes) for x in scheduled],
                               [schedule_stash(x) for x in scheduled], micro_batches,
                               [int(h.get("gradient_sum_bytes", 0)) for h in holds],
                               [int(h.get("carrier_bytes", 0)) for h in holds], scheduler.schedule,
                               scheduler.stages_per_rank,
                               [(int(h.get("pending_gradient_sends", 0)), int(h.get("carrier_in_bytes", 0)))
                                for h in holds])
    return Evaluated(cuts, stages, scheduled, metrics, total_boundary_bytes(tables, cuts))


def schedule_stash(sc: ScheduledStage) -> int:
    """Bytes the stage's schedule holds at its split: what each other micro-batch in flight keeps."""
    return stash_bytes(sc.problem, sc.schedule.events)


def scaled_weights(graph: PipelineGraph, last: Evaluated) -> np.ndarray:
    """Per-op profiled time x its stage's overhead (scheduled / profiled time) in ``last``."""
    factor = np.array([t / s.time_s if s.time_s > 0 else 1.0 for t, s in zip(last.times, last.stages)])
    return graph.time * factor[stage_index(last.cuts, graph.key)]


def balance(graph: PipelineGraph, tables: RangeTables, first: Partition, scheduler: StageScheduler,
            settings: BalanceSettings, memory: MemoryLimit | None = None) -> Balanced:
    """Iterate from ``first``; the chosen plan is the iteration with the smallest t_max."""
    k = first.k
    parts = [first]
    iters = [evaluate(graph, tables, first.cuts, scheduler, settings.micro_batches)]
    reason = "iteration cap reached"
    while True:
        last = iters[-1]
        log.info("iteration %d: t_max %.4f s, rate %.3f, boundary %d B", len(iters) - 1,
                 last.metrics.t_max_s, last.metrics.rate, last.boundary_bytes)
        if last.metrics.rate >= settings.threshold:
            reason = f"rate {last.metrics.rate:.3f} reached the threshold {settings.threshold}"
            break
        if len(iters) > 1 and last.metrics.rate <= iters[-2].metrics.rate:
            reason = f"rate stopped improving ({iters[-2].metrics.rate:.3f} -> {last.metrics.rate:.3f})"
            break
        if len(iters) >= settings.max_iterations:
            break
        part = partition_graph(graph, tables, k, tolerance=settings.tolerance,
                               weights=scaled_weights(graph, last), memory=memory)
        if any(part.cuts == it.cuts for it in iters):
            reason = "re-partition repeated an earlier partition"
            break
        parts.append(part)
        iters.append(evaluate(graph, tables, part.cuts, scheduler, settings.micro_batches))
    chosen = min(range(len(iters)), key=lambda i: (iters[i].metrics.t_max_s, -iters[i].metrics.rate))
    names = tuple(graph.names[i] for i in np.flatnonzero(graph.forward))
    dp_cuts = min_max_cuts(graph.position_weights(graph.time), k, tables, memory, names, graph.cut_ok)
    dp = evaluate(graph, tables, dp_cuts, scheduler, settings.micro_batches)
    return Balanced(parts, iters, chosen, reason, dp, cuts_bottleneck(graph, dp_cuts))


def comparison(graph: PipelineGraph, result: Balanced) -> dict[str, Any]:
    """How far the chosen plan lands from the DP partition, both scheduled at the same budget rule."""
    ours, dp = result.final, result.dp
    return {
        "dp": {"cuts": list(dp.cuts), "profiled_bottleneck_s": result.dp_bottleneck_s,
               "boundary_bytes": dp.boundary_bytes, **dp.metrics.to_dict(),
               "stage_times_s": dp.times},
        "ours_profiled_bottleneck_s": cuts_bottleneck(graph, ours.cuts),
        "bottleneck_ratio": ours.metrics.t_max_s / dp.metrics.t_max_s,
        "profiled_bottleneck_ratio": cuts_bottleneck(graph, ours.cuts) / result.dp_bottleneck_s,
        "boundary_bytes_ratio": ours.boundary_bytes / dp.boundary_bytes if dp.boundary_bytes else None,
    }


def iterations_dict(result: Balanced) -> dict[str, Any]:
    """Every iteration: its split, refinement, per-stage schedule numbers and metrics (no events)."""
    return {
        "chosen_iteration": result.chosen,
        "stop_reason": result.stop_reason,
        "iterations": [{"iteration": i, "weights": "profiled" if i == 0 else "scaled by previous overheads",
                        "split_cuts": list(p.split_cuts),
                        "refinement": p.to_dict()["refinement"], **it.summary()}
                       for i, (p, it) in enumerate(zip(result.partitions, result.iterations))],
        "dp": result.dp.summary(),
    }


def partition_plan(evaluated: Evaluated) -> dict[str, Any]:
    """The plan of one scheduled partition: its cuts and per-stage problems and schedules (plan.json without the
    balance record; what any partition method's cuts become once :func:`evaluate` scheduled them)."""
    stages = []
    for st, sc, peak, n in zip(evaluated.stages, evaluated.scheduled, evaluated.metrics.rank_peak_bytes,
                               evaluated.metrics.in_flight):
        stages.append({**_stage_numbers(st, sc, peak), "nodes": st.nodes,
                       "in_flight": n, "rank_peak_bytes": peak,
                       "problem": sc.problem, "schedule": sc.schedule.to_dict()})
    return {"cuts": list(evaluated.cuts), "boundary_bytes": evaluated.boundary_bytes, "stages": stages}


def plan_dict(graph: PipelineGraph, result: Balanced, settings: BalanceSettings,
              memory: MemoryLimit | None) -> dict[str, Any]:
    """The plan: per-stage problems and schedules of the chosen iteration, and the balance record."""
    final = result.final
    return {
        **partition_plan(final),
        "balance": {
            **final.metrics.to_dict(),
            "threshold": settings.threshold,
            "tolerance": settings.tolerance,
            "micro_batches": settings.micro_batches,
            "max_iterations": settings.max_iterations,
            "iterations": len(result.iterations),
            "chosen_iteration": result.chosen,
            "stop_reason": result.stop_reason,
            "iteration_rates": [it.metrics.rate for it in result.iterations],
            "iteration_t_max_s": [it.metrics.t_max_s for it in result.iterations],
            "memory_limit": vars(memory) if memory else None,
            "formulas": FORMULAS,
            "dp_comparison": comparison(graph, result),
        },
    }
