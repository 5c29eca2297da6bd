"""A training step users can call: a plan compiled into code, taking parameters and a batch.

>>> step = load_step("results/balance/tiny_gpt2/cpu/k1/b0.5", model, batch)
>>> loss, grads = step(dict(model.named_parameters()), batch)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainplan.execute.compile import CompiledPlan, compile_plan
from trainplan.execute.layout import GraphLayout, StageLayout, stage_layouts
from trainplan.execute.plan import PlanError, StagePlan, load_plan, sums_in_place
from trainplan.export.tables import GraphTables, graph_tables
from trainplan.export.trace import TracedStep, trace_training_step
from trainplan.memory_model import storage_weight
from trainplan.models import BuiltModel, default_loss, loss_chunk_bytes


@dataclass
class PlannedStep:
    """``step(params, batch) -> (loss, grads)``: one training step run as the plan says (recomputes, frees
    and swaps at the planned events), with the model's buffers read (and updated, as batch norm does) in
    place. ``params`` maps every parameter name (``model.named_parameters()``) to its tensor; ``batch``
    has the keys and shapes of the batch the step was traced with; ``grads`` maps each name to its gradient."""

    traced: TracedStep
    compiled: CompiledPlan
    buffers: list[torch.Tensor]
    plan: dict[str, Any]
    stages: list[StagePlan]

    @property
    def budget_bytes(self) -> list[int]:
        """Each stage's budget (device bytes, parameters and inputs included) as it runs here, alone."""
        return [st.budget_bytes for st in self.stages]

    @property
    def predicted_peak_bytes(self) -> list[int]:
        """Each stage's planned peak as it runs here, alone (:attr:`StagePlan.alone_peak_bytes`)."""
        return [st.alone_peak_bytes for st in self.stages]

    def flat(self, params: Mapping[str, torch.Tensor], batch: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """The traced step's flat inputs: parameters, buffers, batch tensors."""
        missing = [n for n in self.traced.param_names if n not in params] + [
            n for n in self.traced.batch_names if n not in batch]
        if missing:
            raise KeyError(f"model '{self.traced.model}': step inputs lack {missing[:3]}")
        return ([params[n].detach() for n in self.traced.param_names] + self.buffers
                + [batch[n] for n in self.traced.batch_names])

    def __call__(self, params: Mapping[str, torch.Tensor],
                 batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, *grads = self.compiled(*self.flat(params, batch))
        return loss, dict(zip(self.traced.param_names, grads))


def plan_file(plan: str | Path) -> Path:
    """``plan`` itself, or ``plan.json`` in it where it is a directory."""
    path = Path(plan)
    return path / "plan.json" if path.is_dir() else path


def load_step(plan: str | Path, model: torch.nn.Module, batch: Mapping[str, torch.Tensor], *,
              loss_fn: Callable[[Any], torch.Tensor] = default_loss, name: str | None = None) -> PlannedStep:
    """The training step of ``model`` on batches shaped like ``batch``, compiled under the plan in ``plan``
    (a balance output directory holding ``plan.json``, or the file). ``loss_fn`` turns the model's output
    into the loss (default: its ``.loss``, as the workflow's models). The step is traced again here, on the
    device ``model`` is on, its loss head chunked as the plan's model was (``loss_chunk``); a plan made for
    another graph raises PlanError naming the plan and the node."""
    path = plan_file(plan)
    data, stages = load_plan(path)
    built = BuiltModel(name or str(data.get("model", "model")), model,
                       {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}, loss_fn,
                       loss_chunk_bytes(str(path), data))
    traced, flat = trace_training_step(built, sums_in_place=sums_in_place(stages))
    return compile_step(data, stages, traced, flat, graph_tables(traced), where=str(path))


def compile_step(data: dict[str, Any], stages: list[StagePlan], traced: TracedStep, flat: list[torch.Tensor],
                 tables: GraphTables, *, where: str) -> PlannedStep:
    """The plan ``data`` (its parsed ``stages``) compiled on the traced step whose real flat inputs are
    ``flat``; a stage without a schedule, or one made for another graph, raises PlanError naming ``where``."""
    layout, layouts = plan_layouts(stages, traced, flat, tables, where=where)
    device = next((t.device for t in flat), torch.device("cpu"))
    compiled = compile_plan(traced.gm, layout, layouts, [st.events for st in stages], device=device)
    n_p = len(traced.param_names)
    buffers = [t.detach() for t in flat[n_p:n_p + len(traced.buffer_names)]]
    return PlannedStep(traced, compiled, buffers, data, stages)


def plan_layouts(stages: list[StagePlan], traced: TracedStep, flat: list[torch.Tensor], tables: GraphTables, *,
                 where: str) -> tuple[GraphLayout, list[StageLayout]]:
    """Where the plan's storages live in the traced step, whole and per stage; a stage without a schedule, or
    one made for another graph, raises PlanError naming ``where``."""
    unscheduled = [st.index for st in stages if not st.executable]
    if unscheduled:
        raise PlanError(f"{where}: stage(s) {unscheduled} have no schedule to run (infeasible at this budget)")
    known = set(tables.nodes.name)
    size = dict(zip(tables.tensors.storage, tables.tensors.storage_bytes))
    for st in stages:
        unknown = [n for n in st.nodes if n not in known]
        if unknown:
            raise PlanError(f"{where}: stage {st.index} names fx node(s) {unknown[:3]} that the traced step of "
                            f"'{traced.model}' lacks (a plan for another model, batch shape or torch version)")
        for op in st.raw["ops"]:
            real = sum(storage_weight(st.raw.get("allocation"), int(size.get(sid, 0))) for sid in op["storages"])
            if real != int(op["bytes"]):
                raise PlanError(f"{where}: stage {st.index} op '{op['id']}' holds {real} B in this trace, the plan "
                                f"says {op['bytes']} B (a plan for another batch shape or dtype)")
    layout = GraphLayout.build(traced.gm, [t.detach() for t in flat], tables.tensors)
    return layout, stage_layouts(stages, layout)
