"""The methods a frontier compares, each turned into a callable doing one full training step.

A method is ``kind`` or ``kind@value``: ``eager``; ``hf_checkpointing`` (Hugging Face's
``gradient_checkpointing_enable()``); ``compile@B`` (``torch.compile`` with
``activation_memory_budget = B``); ``compile+exact@B`` (the same, its knapsack solved exactly by
:class:`trainplan.loop.knapsack.ExactKnapsack`); ``trainplan@F`` (``trainplan.plan`` at budget F: a fraction
or bytes); ``trainplan+opt@F`` (the optimizer in the plan); ``trainplan+cce@F`` and ``trainplan+opt+cce@F``
(the same with the loss head chunked: ``loss_chunk=LOSS_CHUNK``, :mod:`trainplan.export.loss_head`);
``trainplan+fused@F`` (the plan made on the model whose forward groups, matrix products left out, run as
Inductor-compiled fused ops, :mod:`trainplan.fuse.fused_ops`) and ``trainplan+opt+fused@F`` (that, the optimizer
in the plan); ``sac@F`` and ``sac+compile@F`` (the plan of ``trainplan@F`` exported as selective activation
checkpointing, eager or under ``torch.compile``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainplan.frontier.method_names import Method, MethodError
from trainplan.loop.updates import state_bytes
from trainplan.memory_model import allocation_bytes
from trainplan.models import BuiltModel

#: the logits chunk of the ``+cce`` methods: smaller holds less, but each chunk adds one pass over the head's
#: weight gradient (GPT-2 at 4 x 512: 7 chunks of up to 333 rows, each adding into the 147 MiB gradient)
LOSS_CHUNK = "64MiB"


@dataclass(frozen=True)
class Prepared:
    """One training step of a method (``step``: ``forward_backward`` then ``update``), facts about it (the plan's
    budget and status, the export's summary), its setup seconds (compiling, or tracing, profiling and solving)
    and the bytes held outside the step (``held()``:
    parameters, buffers and batch, which a plan's budget counts, and the optimizer's state where the plan holds
    the optimizer: ``+opt``; a plan without it, and its SAC export, budget forward and backward alone)."""

    forward_backward: Callable[[], float]  # forward, loss and backward: the loss
    update: Callable[[], None]  # the optimizer's step and zero_grad
    facts: dict[str, Any]
    setup_s: float
    held: Callable[[], int]

    def step(self) -> float:
        loss = self.forward_backward()
        self.update()
        return loss


def _fused(built: BuiltModel) -> tuple[torch.nn.Module, dict[str, Any]]:
    """``built``'s model with its forward groups (Inductor's support table without the matrix products:
    ``fuse.support.without_matmuls``; groups of more than ``MAX_OPS`` split) as fused ops, and how many."""
    from trainplan.fuse.planned import fuse_built
    from trainplan.fuse.split import MAX_OPS
    from trainplan.fuse.support import builtin_table

    model = fuse_built(built, builtin_table("inductor-no-matmul"), max_ops=MAX_OPS)
    return model.built.module, {"fused_groups": len(model.fused), "fused_ops": sum(f["n_ops"] for f in model.fused),
                                "unfused_groups": len(model.unfused)}


def prepare(built: BuiltModel, method: Method, *, cache: Path, time_limit_s: float) -> Prepared:
    """``built``'s training step (forward, loss, backward, AdamW step, zero_grad) under ``method``."""
    from transformers.loss.loss_utils import LOSS_MAPPING

    import trainplan
    from trainplan.loop.knapsack import ExactKnapsack
    from trainplan.loop.sac import sac_policy

    module, batch = built.module, built.batch
    if hasattr(module, "config"):
        module.config.use_cache = False
    if hasattr(module, "loss_type") and module.loss_type not in LOSS_MAPPING:
        module.loss_type = "ForCausalLM"  # the loss HF falls back to, with a warning torch.compile breaks the graph at
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
    optimizer_in_plan = method.optimizer_in_plan
    facts: dict[str, Any] = {}
    start = time.perf_counter()
    forward: Callable[..., Any] = module
    if method.kind == "hf_checkpointing":
        if not getattr(module, "supports_gradient_checkpointing", False):
            raise MethodError(f"method hf_checkpointing: model '{built.name}' ({type(module).__name__}) does not "
                              "support Hugging Face gradient checkpointing")
        module.gradient_checkpointing_enable()
    elif method.kind.startswith("compile"):
        torch._functorch.config.activation_memory_budget = float(method.value)
        if method.kind == "compile+exact":
            torch._functorch.config.activation_memory_budget_solver = ExactKnapsack(time_limit_s=time_limit_s)
        forward = torch.compile(module)
    elif method.kind != "eager":
        if method.kind.endswith("+fused"):  # the fused module holds the model's parameters, the optimizer's
            module, facts = _fused(built)
        planned = trainplan.plan(module, batch, method.value, on_infeasible="raise_budget",
                                 optimizer=optimizer if optimizer_in_plan else None,
                                 loss_chunk=LOSS_CHUNK if method.kind.endswith("+cce") else None,
                                 time_limit_s=time_limit_s, cache_dir=cache, progress=False)
        report = planned.report
        facts |= {"planned_budget_bytes": report.planned_budget_bytes, "predicted_peak_bytes": report.predicted_peak_bytes,
                 "predicted_step_s": report.predicted_step_s, "plan_status": report.status}
        forward = planned
        if method.kind.startswith("sac"):
            export = sac_policy(planned)
            export.apply(module, strict=method.kind == "sac")
            forward = torch.compile(module) if method.kind == "sac+compile" else module
            facts["sac"] = export.summary()

    def forward_backward() -> float:
        loss = built.loss_fn(forward(**batch))
        loss.backward()
        return float(loss.detach())

    def update() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def held() -> int:
        """Weighed as a plan's problem weighs them (allocation sizes: a mapped tensor's pages, its objects), as
        the process holds them; the optimizer's state at its data bytes, as the plan counts it."""
        tensors = [*module.parameters(), *module.buffers(), *(v for v in batch.values() if isinstance(v, torch.Tensor))]
        optimizer_state = state_bytes(optimizer) if optimizer_in_plan else 0  # in the plan's budget only there
        return sum(allocation_bytes(t.device.type, t.numel() * t.element_size()) for t in tensors) + optimizer_state

    if "compile" in method.kind:  # compiles forward and backward: part of the setup; no update, so that every
        built.loss_fn(forward(**batch)).backward()  # method's measured steps follow as many updates
        optimizer.zero_grad(set_to_none=True)
    return Prepared(forward_backward, update, facts, time.perf_counter() - start, held)
