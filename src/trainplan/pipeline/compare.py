"""Partition methods compared as real pipelines: each method's partition of a profiled graph scheduled at one
budget and written as a plan (:func:`method_plans`), then run with the same schedule and micro-batch count
(:func:`run_plan`), a table row per run (:func:`comparison_row`). ``bench/bench_pipeline.py`` runs the grid."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from trainplan.budget import Budget
from trainplan.io import read_json
from trainplan.partition import (BalanceSettings, MemoryLimit, PartitionError, SolverSettings, StageScheduler, balance,
                                 partition_graph, pipeline_graph, range_tables)
from trainplan.partition.balance import evaluate, partition_plan
from trainplan.partition.layers import Layers, model_layers
from trainplan.partition.methods import METHODS, method_cuts
from trainplan.pipeline.launch import launch
from trainplan.pipeline.run import RunSettings
from trainplan.schedule.pipeline_hold import PipelineHold

OURS = "ours"
ALL_METHODS = (*METHODS, OURS)
MIB = 2**20


def method_plans(model: str, device: str, nodes: pd.DataFrame, tensors: pd.DataFrame, k: int, budget: Budget, *,
                 bandwidth: float, swaps: bool, solver: SolverSettings, settings: BalanceSettings,
                 memory: MemoryLimit | None, methods: tuple[str, ...] = ALL_METHODS,
                 allocation: str | None = None, stages_per_rank: int = 1) -> dict[str, dict[str, Any]]:
    """Each method's plan of the profiled graph (``nodes`` with ``time_s``) in ``k`` stages at ``budget``, every
    stage scheduled by one scheduler (identical stages solved once) for a pipeline of ``settings.micro_batches``
    under ``settings.schedule`` with ``stages_per_rank`` (its in-flight micro-batches held in each rank's budget):
    plan.json's stage fields
    with the cuts, the partition's rate and t_max, and ``same_as`` (the first method with the same cuts);
    ``{"error": ...}`` for a method that cannot make k stages or whose stage meets no budget. ``ours``: the balance
    rule's plan."""
    graph = pipeline_graph(nodes, tensors)
    tables = range_tables(graph)
    hold = PipelineHold(k, settings.micro_batches, settings.schedule, stages_per_rank)
    scheduler = StageScheduler(nodes, tensors, bandwidth=bandwidth, budget=budget, solver=solver, swap=swaps,
                               pipeline=hold, allocation=allocation)
    memory = replace(memory, micro_batches=hold.micro_batches, schedule=hold.schedule,
                     stages_per_rank=stages_per_rank) if memory is not None else None
    try:
        layers: Layers | str = model_layers(graph, nodes, tensors, model)
    except PartitionError as exc:  # the methods that split at layers fail, the others run
        layers = str(exc)
    out: dict[str, dict[str, Any]] = {}
    first_of: dict[tuple[int, ...], str] = {}
    for method in methods:
        try:
            if method == OURS:
                start = partition_graph(graph, tables, k, tolerance=settings.tolerance, memory=memory)
                evaluated = balance(graph, tables, start, scheduler, settings, memory).final
            else:
                cuts = method_cuts(method, k, graph=graph, tables=tables, layers=layers, memory=memory)
                evaluated = evaluate(graph, tables, cuts, scheduler, settings.micro_batches)
        except PartitionError as exc:
            out[method] = {"error": f"model '{model}', method '{method}': {exc}"}
            continue
        first = first_of.setdefault(evaluated.cuts, method)
        out[method] = {"model": model, "device": device, "k": k, **budget.fields(), "partition_method": method,
                       "same_as": first if first != method else None,
                       **partition_plan(evaluated), "rate": evaluated.metrics.rate,
                       "t_max_s": evaluated.metrics.t_max_s}
    return out


def as_method(plan: dict[str, Any], method: str) -> dict[str, Any]:
    """A plan made elsewhere (the balance rule's) with the fields of :func:`method_plans`' plans, as ``method``."""
    return {**plan, "partition_method": method, "same_as": None,
            "rate": plan["balance"]["rate"], "t_max_s": plan["balance"]["t_max_s"]}


def add_plan(plans: dict[str, dict[str, Any]], method: str, plan: dict[str, Any]) -> None:
    """Add ``method``'s plan made elsewhere (one of :func:`method_plans`' or :func:`as_method`'s), ``same_as`` the
    first method with its cuts."""
    first = next((m for m, p in plans.items() if "error" not in p and p["cuts"] == plan["cuts"]), None)
    plans[method] = {**plan, "partition_method": method, "same_as": first}


def run_plan(plan_path: Path, settings: RunSettings, ranks: int) -> dict[str, Any]:
    """Run the plan at ``plan_path`` as a pipeline on ``ranks`` ranks; the artifact, or ``{"error": ...}`` naming the
    log (beside the artifact) when a rank failed."""
    log = settings.artifact.with_suffix(".log")
    with open(log, "w") as handle:
        code = launch(settings, ranks, output=handle)
    if code != 0:
        return {"error": f"{plan_path}: a rank failed (exit {code}): see {log}"}
    return read_json(settings.artifact)


def comparison_row(plan: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """One row: the method's partition and its prediction, and the run's measurements (or the error)."""
    if "error" in plan:
        return {"error": plan["error"]}
    out: dict[str, Any] = {"cuts": str(plan["cuts"]), "same_as": plan["same_as"], "planned_rate": plan["rate"],
                           "planned_t_max_s": plan["t_max_s"], "boundary_bytes": plan["boundary_bytes"],
                           "stage_status": ",".join(st["status"] for st in plan["stages"]),
                           "rank_status": ",".join(st.get("rank_status", "") for st in plan["stages"])}
    if "error" in run:
        return {**out, "error": run["error"]}
    pred, ranks = run["prediction"], run["ranks"]
    return {**out, "predicted_step_s": pred["step_time_s"], "predicted_step_comm_s": pred["step_time_with_comm_s"],
            "measured_step_s": run["measured"]["step_s"],
            "measured_step_min_s": min(run["measured"]["step_s_repeats"]),
            "measured_step_max_s": max(run["measured"]["step_s_repeats"]),
            "measured_over_predicted_comm": run["measured"]["over_predicted_with_comm"],
            "simulated_step_s": run["simulated"]["step_time_s"],
            "measured_over_simulated": run["measured"]["over_simulated"],
            "co_run_slowdown": str([None if x is None else round(x, 3) for x in run["measured"]["co_run_slowdown"]]),
            "compute_ms": str([round(r["compute_s"] * 1e3, 2) for r in ranks]),
            "send_recv_ms": str([round(r["send_recv_s"] * 1e3, 2) for r in ranks]),
            "idle_ms": str([round(r["idle_s"] * 1e3, 2) for r in ranks]),
            "peak_mib": max((r["peak_bytes"] or 0) for r in ranks) / MIB,
            "predicted_peak_mib": max(pred["peak_bytes"] or [0]) / MIB,
            "held_peak_mib": str([round((m["measured_peak_bytes"] or 0) / MIB, 1) for m in run["memory"]]),
            "tensor_peak_mib": str([round((m.get("measured_tensor_peak_bytes") or 0) / MIB, 1) for m in run["memory"]]),
            "rank_predicted_mib": str([round((m["predicted_peak_bytes"] or 0) / MIB, 1) for m in run["memory"]]),
            "budget_mib": str([round((m["budget_bytes"] or 0) / MIB, 1) for m in run["memory"]]),
            "over_budget_ranks": sum(m["within_budget"] is False for m in run["memory"]),
            "carrier_bytes": run["stages"][0]["carrier_out_bytes"]}
