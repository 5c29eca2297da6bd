"""Plan one training step of a user's model (one stage): trace it, then read its plan from the cache or profile
it and solve it at the budget, and compile the plan into a step (``execute.step.compile_step``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from trainplan.budget import Budget, format_bytes
from trainplan.execute.plan import parse_plan, plan_stage
from trainplan.execute.step import PlannedStep, compile_step
from trainplan.export.tables import GraphTables, graph_tables
from trainplan.export.trace import TracedStep, trace_training_step
from trainplan.host_swap import memory_model
from trainplan.io import write_json
from trainplan.loop.cache import batch_signature, graph_digest, new_record, plan_key, qualified_name, read_record
from trainplan.loop.errors import InfeasibleBudgetError
from trainplan.loop.progress import phase_bar
from trainplan.loop.report import PlanReport
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
    swap: bool | None  # None: swaps where the device's host memory is separate (host_swap.memory_model)
    profile_repeats: int
    on_infeasible: str  # one of ON_INFEASIBLE
    cache_dir: Path
    progress: bool

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


def trace(model: torch.nn.Module, batch: Mapping[str, torch.Tensor],
          loss_fn: Callable[[Any], torch.Tensor]) -> tuple[TracedStep, list[torch.Tensor], GraphTables]:
    """The model's training step on ``batch`` traced in training mode, its real flat inputs and its tables."""
    with _training_trace_mode(model):
        traced, flat = trace_training_step(BuiltModel(type(model).__name__, model, dict(batch), loss_fn))
    return traced, flat, graph_tables(traced)


def _profiled_nodes(traced: TracedStep, flat: list[torch.Tensor], tables: GraphTables, device: torch.device,
                    settings: PlanSettings) -> pd.DataFrame:
    """The op table with each op's profiled ``time_s``. The profile runs the step on copies of the model's
    buffers (batch norm's running statistics stay as they are) and on a forked random generator (the
    user's random stream stays as it is)."""
    n_p, n_b = len(traced.param_names), len(traced.buffer_names)
    inputs = [t.detach().clone() if n_p <= i < n_p + n_b else t for i, t in enumerate(flat)]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        result = profile_nodes(traced, inputs, tables.nodes, repeats=settings.profile_repeats, warmup=PROFILE_WARMUP,
                               device=str(device), progress=settings.progress)
    return tables.nodes.merge(result.ops[["name", "time_s"]], on="name", validate="one_to_one")


def _solved_stage(traced: TracedStep, flat: list[torch.Tensor], tables: GraphTables, device: torch.device,
                  settings: PlanSettings) -> dict[str, Any]:
    """Profile the step and solve its one stage at the budget (``execute.plan.plan_stage``)."""
    nodes = _profiled_nodes(traced, flat, tables, device, settings)
    bandwidth, _ = host_link_bytes_per_s({"type": str(device), "host_link_gbytes_per_s": "measured"}, nodes,
                                         repeats=settings.profile_repeats, warmup=PROFILE_WARMUP)
    with phase_bar(f"solve {traced.model}", settings.progress, settings.time_limit_s):
        return plan_stage(nodes, tables.tensors, nodes.name.tolist(), index=0, budget=settings.budget,
                          bandwidth=bandwidth, swap=settings.swaps_on(device), time_limit_s=settings.time_limit_s,
                          workers=settings.workers, seed=settings.seed)


def _key_fields(traced: TracedStep, batch: Mapping[str, torch.Tensor], device: torch.device,
                settings: PlanSettings) -> dict[str, Any]:
    """What the plan is made for: every input of the planner that changes the plan it makes."""
    return {"graph": graph_digest(traced.gm), "batch": batch_signature(batch), "device": _device_label(device),
            "budget": str(settings.budget), "loss_fn": qualified_name(settings.loss_fn),
            "solver": {"time_limit_s": settings.time_limit_s, "workers": settings.workers, "seed": settings.seed,
                       "swap": settings.swaps_on(device), "profile_repeats": settings.profile_repeats},
            "torch": torch.__version__}


def _infeasible(report: PlanReport, settings: PlanSettings) -> InfeasibleBudgetError:
    """The error naming the requested budget, whether it is proven infeasible, and the least budget reached."""
    requested, least = report.requested_budget_bytes, report.planned_budget_bytes
    asked = f"{settings.budget}" if settings.budget.bytes is not None else f"{settings.budget} = {requested} B"
    known = ("it is proven infeasible" if report.status == "proven_infeasible"
             else f"none was found within time_limit_s={settings.time_limit_s:g} (not proven infeasible: a longer "
                  "limit may meet it)")
    return InfeasibleBudgetError(
        f"budget {asked} ({format_bytes(requested)}) is met by no schedule of this step: {known}. The least budget "
        f"reached is {format_bytes(least)} ({least} B; found by bisection to {DEFAULTS.bisect_tolerance:.1%}, not proven "
        f"least: the proven floor is {report.floor_bytes} B). Pass on_infeasible='raise_budget' to train at it")


def plan_step(model: torch.nn.Module, batch: Mapping[str, torch.Tensor],
              settings: PlanSettings) -> tuple[PlannedStep, PlanReport]:
    """The model's training step on batches shaped like ``batch``, compiled under a plan at the budget, and its
    report. The plan is read from the cache when one was made for this graph, batch, device, budget, loss and
    settings; else the step is profiled and solved, and the plan cached. A budget no schedule was found within
    raises InfeasibleBudgetError unless ``settings.on_infeasible`` is ``"raise_budget"``."""
    start = time.perf_counter()
    device = model_device(model)
    with phase_bar(f"trace {type(model).__name__}", settings.progress):
        traced, flat, tables = trace(model, batch, settings.loss_fn)
    key, fields = plan_key(_key_fields(traced, batch, device, settings))
    path = settings.cache_dir / f"{key}.json"
    record = read_record(path, fields)
    hit = record is not None
    if record is None:
        record = new_record(fields, [_solved_stage(traced, flat, tables, device, settings)])
        write_json(path, record)
    log.info("plan %s: %s", "cache hit" if hit else "made and cached", path)
    stages = parse_plan(record, str(path))
    step = compile_step(record, stages, traced, flat, tables, where=str(path))
    report = PlanReport.of(stages[0], cache_hit=hit, cache_path=path, plan_s=time.perf_counter() - start)
    if report.status != "met" and settings.on_infeasible == "raise":
        raise _infeasible(report, settings)
    return step, report
