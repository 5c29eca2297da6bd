"""Plan one training step of a user's model (one stage): trace it (with the optimizer's updates in it where the
user hands one over: ``loop.update_pass``), then read its plan from the cache or profile it and solve it at the
budget, and compile the plan into a step (``execute.step.compile_step``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from trainplan.artifacts import with_measured_workspaces
from trainplan.budget import Budget, format_bytes
from trainplan.execute.plan import parse_plan, plan_stage
from trainplan.execute.step import PlannedStep, compile_step
from trainplan.export.tables import GraphTables, graph_tables
from trainplan.export.trace import TracedStep, trace_training_step
from trainplan.io import write_json
from trainplan.loop.cache import (batch_signature, graph_digest, new_record, package_digest, plan_key, qualified_name,
                                  read_record)
from trainplan.loop.errors import InfeasibleBudgetError
from trainplan.loop.progress import phase_bar
from trainplan.loop.report import PlanReport
from trainplan.loop.update_op import updates_bound
from trainplan.loop.update_pass import UPDATE_PREFIX, check_update_order, with_updates
from trainplan.loop.updates import ParamUpdates, scratch_updates, update_costs
from trainplan.memory_model import memory_model
from trainplan.models import BuiltModel
from trainplan.profile.link import host_link_bytes_per_s
from trainplan.profile.op_times import profile_nodes
from trainplan.schedule.settings import DEFAULTS

log = logging.getLogger(__name__)

ON_INFEASIBLE = ("raise", "raise_budget")
PROFILE_WARMUP = 1


@dataclass(frozen=True)
class PlanSettings:
    """How :func:`plan_step` plans: the budget, the loss, the solver's and the profile's settings (all of which
    change the plan, and key the cache), and what it does about a budget no schedule meets."""

    budget: Budget
    loss_fn: Callable[[Any], torch.Tensor]
    time_limit_s: float
    workers: int
    seed: int
    swap: bool | None  # None: swaps where the device's host memory is separate (memory_model.memory_model)
    profile_repeats: int
    on_infeasible: str  # one of ON_INFEASIBLE
    cache_dir: Path
    progress: bool
    optimizer: torch.optim.Optimizer | None = None  # in the plan: each update runs in backward (loop.updates)
    loss_chunk_bytes: int | None = None  # the loss head chunked to logits of at most this (export.loss_head)

    def swaps_on(self, device: torch.device) -> bool:
        return self.swap if self.swap is not None else memory_model(device.type).swaps


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer (the CPU for a model without either)."""
    return next((t.device for t in (*model.parameters(), *model.buffers())), torch.device("cpu"))


def _device_label(device: torch.device) -> str:
    """The device as a plan is made for it: a GPU by its name too (its op times are the plan's)."""
    return f"{device} {torch.cuda.get_device_name(device)}" if device.type == "cuda" else str(device)


@contextmanager
def _training_trace_mode(model: torch.nn.Module) -> Iterator[None]:
    """The model in training mode, every parameter requiring grad (as the trace needs); both restored after."""
    was_training, flags = model.training, [p.requires_grad for p in model.parameters()]
    model.train()
    try:
        yield
    finally:
        model.train(was_training)
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)


def trace(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], loss_fn: Callable[[Any], torch.Tensor],
          loss_chunk_bytes: int | None = None) -> tuple[TracedStep, list[torch.Tensor], GraphTables]:
    """The model's training step on ``batch`` traced in training mode (its loss head chunked with
    ``loss_chunk_bytes``), its real flat inputs and its tables."""
    with _training_trace_mode(model):
        built = BuiltModel(type(model).__name__, model, dict(batch), loss_fn, loss_chunk_bytes)
        traced, flat = trace_training_step(built)
    return traced, flat, graph_tables(traced)


@dataclass(frozen=True)
class Traced:
    """A traced step, its real flat inputs, its tables and the device it runs on."""

    step: TracedStep
    flat: list[torch.Tensor]
    tables: GraphTables
    device: torch.device


def _profiled_nodes(traced: Traced, settings: PlanSettings, updates: ParamUpdates | None) -> tuple[pd.DataFrame, int]:
    """The op table with each op's profiled ``time_s`` and ``workspace_bytes`` (measured, or the tables' own
    ops' and an update's temporaries where larger: ``artifacts.with_measured_workspaces``), and the bytes of the
    optimizer's state (0 without updates). The profile runs the step on copies of the model's buffers (batch norm's running statistics stay as they are), with updates on
    copies of the parameters and the optimizer (the model and the optimizer stay as they are), on a forked
    random generator (the user's random stream stays as it is)."""
    n_p, n_b = len(traced.step.param_names), len(traced.step.buffer_names)
    inputs = [t.detach().clone() if n_p <= i < n_p + n_b else t for i, t in enumerate(traced.flat)]
    nodes = traced.tables.nodes.copy()
    scratch = scratch_updates(updates) if updates is not None else None
    if scratch is not None:
        inputs[:n_p] = [p.detach() for p in scratch.params]
    with torch.random.fork_rng(devices=[traced.device] if traced.device.type == "cuda" else []), \
            (updates_bound(scratch) if scratch is not None else nullcontext()):
        result = profile_nodes(traced.step, inputs, nodes, repeats=settings.profile_repeats, warmup=PROFILE_WARMUP,
                               device=str(traced.device), progress=settings.progress)
    nodes = nodes.merge(result.ops[["name", "time_s", "workspace_measured_bytes"]], on="name", validate="one_to_one")
    state = 0
    if scratch is not None:
        costs = update_costs(scratch, traced.device)
        is_update = nodes.name.str.startswith(UPDATE_PREFIX)
        nodes.loc[is_update, "workspace_bytes"] = [
            costs.workspace_bytes[int(n.removeprefix(UPDATE_PREFIX))] for n in nodes.name[is_update]]
        state = costs.state_bytes
    return with_measured_workspaces(nodes), state


def _solved_stage(traced: Traced, settings: PlanSettings, updates: ParamUpdates | None) -> dict[str, Any]:
    """Profile the step and solve its one stage at the budget (``execute.plan.plan_stage``)."""
    nodes, state_bytes = _profiled_nodes(traced, settings, updates)
    bandwidth, _ = host_link_bytes_per_s({"type": str(traced.device), "host_link_gbytes_per_s": "measured"}, nodes,
                                         repeats=settings.profile_repeats, warmup=PROFILE_WARMUP)
    with phase_bar(f"solve {traced.step.model}", settings.progress, settings.time_limit_s):
        return plan_stage(nodes, traced.tables.tensors, nodes.name.tolist(), index=0, budget=settings.budget,
                          bandwidth=bandwidth, allocation=traced.device.type, swap=settings.swaps_on(traced.device),
                          time_limit_s=settings.time_limit_s, workers=settings.workers, seed=settings.seed,
                          optimizer_state_bytes=state_bytes)


def _key_fields(traced: TracedStep, batch: Mapping[str, torch.Tensor], device: torch.device,
                settings: PlanSettings) -> dict[str, Any]:
    """What the plan is made for: every input of the planner that changes the plan it makes."""
    return {"graph": graph_digest(traced.gm), "batch": batch_signature(batch), "device": _device_label(device),
            "budget": {"bytes": settings.budget.bytes, "fraction": settings.budget.fraction}, "loss_fn": qualified_name(settings.loss_fn),
            "solver": {"time_limit_s": settings.time_limit_s, "workers": settings.workers, "seed": settings.seed,
                       "swap": settings.swaps_on(device), "profile_repeats": settings.profile_repeats},
            "optimizer": _optimizer_signature(settings.optimizer), "torch": torch.__version__,
            "trainplan_code": package_digest()}


def _optimizer_signature(optimizer: torch.optim.Optimizer | None) -> dict[str, Any] | None:
    """What of the optimizer changes the plan (its updates' times and bytes): its class and settings."""
    if optimizer is None:
        return None
    groups = [{k: repr(v) for k, v in sorted(g.items()) if k != "params"} | {"params": len(g["params"])}
              for g in optimizer.param_groups]
    return {"class": qualified_name(type(optimizer)), "groups": groups}


def _infeasible(report: PlanReport, settings: PlanSettings) -> InfeasibleBudgetError:
    """The error naming the requested budget, whether it is proven infeasible, and the least budget reached."""
    requested, least = report.requested_budget_bytes, report.planned_budget_bytes
    asked = f"{requested} B" if settings.budget.bytes is not None else f"{settings.budget} = {requested} B"
    known = ("it is proven infeasible" if report.status == "proven_infeasible"
             else f"none was found within time_limit_s={settings.time_limit_s:g} (not proven infeasible: a longer "
                  "limit may meet it)")
    return InfeasibleBudgetError(
        f"budget {asked} ({format_bytes(requested)}) is met by no schedule of this step: {known}. The least budget "
        f"reached is {format_bytes(least)} ({least} B; found by bisection to {DEFAULTS.bisect_tolerance:.1%}, not proven "
        f"least: the proven floor is {report.floor_bytes} B). Pass on_infeasible='raise_budget' to train at it")


def plan_step(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], settings: PlanSettings,
              updates: ParamUpdates | None = None) -> tuple[PlannedStep, PlanReport]:
    """The model's training step on batches shaped like ``batch``, compiled under a plan at the budget, and its
    report; with ``updates`` (the optimizer of ``settings``), the step updates each parameter in backward.
    The plan is read from the cache when one was made for this graph, batch, device, budget, loss, optimizer
    and settings; else the step is profiled and solved, and the plan cached. A budget no schedule was found
    within raises InfeasibleBudgetError unless ``settings.on_infeasible`` is ``"raise_budget"``."""
    start = time.perf_counter()
    device = model_device(model)
    with phase_bar(f"trace {type(model).__name__}", settings.progress):
        step_fx, flat, tables = trace(model, batch, settings.loss_fn, settings.loss_chunk_bytes)
        if updates is not None:
            step_fx = with_updates(step_fx, tables)
            tables = graph_tables(step_fx)
    trace_s = time.perf_counter() - start
    traced = Traced(step_fx, flat, tables, device)
    key, fields = plan_key(_key_fields(step_fx, batch, device, settings))
    path = settings.cache_dir / f"{key}.json"
    record = read_record(path, fields)
    hit = record is not None
    if record is None:
        record = new_record(fields, [_solved_stage(traced, settings, updates)])
        write_json(path, record)
    log.info("plan %s: %s", "cache hit" if hit else "made and cached", path)
    stages = parse_plan(record, str(path))
    if updates is not None:
        check_update_order(stages[0].raw["ops"], stages[0].events, tables, where=str(path))
    step = compile_step(record, stages, step_fx, flat, tables, where=str(path))
    report = PlanReport.of(stages[0], cache_hit=hit, cache_path=path, plan_s=time.perf_counter() - start,
                           trace_s=trace_s)
    if report.status != "met" and settings.on_infeasible == "raise":
        raise _infeasible(report, settings)
    return step, report
