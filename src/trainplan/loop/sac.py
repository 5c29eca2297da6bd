"""A plan exported as PyTorch selective activation checkpointing (SAC): one checkpointed region per block,
each with a policy that saves what the plan keeps and recomputes what the plan recomputes.

>>> planned = trainplan.plan(model, batch, 0.5)
>>> export = sac_policy(planned)               # regions: the blocks of the model's ModuleLists
>>> with export.applied(model):                # or export.apply(model) for good
...     loss = model(**batch).loss; loss.backward()

What SAC cannot say and the export therefore loses (``SacExport.lost``): a region's recomputation runs all at
once when backward first needs one of its tensors, and reruns every op the policy does not save up to the last
one needed (the plan reruns only the ops it chose, each when it is needed); a region's inputs are always kept;
ops outside every region are saved as autograd saves them (a chunked loss head too: the model computes its own);
the optimizer-in-backward updates are not exported.
``torch.utils.checkpoint`` treats ``CPU_OFFLOAD`` as recompute in eager mode (only ``torch.compile``'s
partitioner offloads), so a plan's swaps are exported as ``MUST_CPU_OFFLOAD`` and take effect under
``torch.compile`` alone.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.checkpoint import (
    SAC_IGNORED_OPS,
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from trainplan.export.loss_head_op import linear_cross_entropy
from trainplan.export.trace import TracedStep, module_path
from trainplan.loop.module import PlannedModule


class SacExportError(ValueError):
    """A plan that cannot be exported, or a region whose ops differ from the traced ones (the message names both)."""


@dataclass(frozen=True)
class RegionPolicy:
    """The policy of one region: for each aten op, the policy of its k-th call in the region's forward
    (``nodes`` names the traced fx node of each call)."""

    region: str
    calls: dict[Any, list[CheckpointPolicy]]
    nodes: dict[Any, list[str]]
    unmatched: Counter[str] = field(default_factory=Counter)

    def policy_fn(self, strict: bool) -> Callable[..., CheckpointPolicy]:
        """A fresh policy function (its own call counters) for one forward of the region. A call the traced
        step did not make raises SacExportError (``strict``) or is left to PyTorch (``PREFER_RECOMPUTE``) and
        counted in ``unmatched``: under ``torch.compile`` the region is traced after decompositions, so
        some calls (dropout's clone) differ from eager's."""
        seen: Counter[Any] = Counter()

        def policy(_ctx: Any, func: Any, *_args: Any, **_kwargs: Any) -> CheckpointPolicy:
            k = seen[func]
            seen[func] += 1
            planned = self.calls.get(func, [])
            if k < len(planned):
                return planned[k]
            if strict:
                raise SacExportError(
                    f"region '{self.region}': call {k + 1} of {func} was not in the traced step "
                    f"({len(planned)} traced); the region runs other ops than the planned graph")
            self.unmatched[str(func)] += 1
            return CheckpointPolicy.PREFER_RECOMPUTE

        return policy

    def context_fn(self, strict: bool) -> Callable[[], tuple[Any, Any]]:
        """``checkpoint``'s ``context_fn``: SAC contexts with a fresh policy function per call (a plain
        function, as ``torch.compile`` requires of it)."""

        def contexts() -> tuple[Any, Any]:
            return create_selective_checkpoint_contexts(self.policy_fn(strict))

        return contexts

    def counts(self) -> dict[str, int]:
        """Calls per policy name."""
        return dict(Counter(p.name for ps in self.calls.values() for p in ps))


@dataclass
class SacExport:
    """Per-region SAC policies of a plan, and what the export cannot express."""

    regions: dict[str, RegionPolicy]
    lost: dict[str, list[str]] = field(default_factory=dict)

    def apply(self, model: torch.nn.Module, *, strict: bool = True) -> Callable[[], None]:
        """Run each region of ``model`` under ``torch.utils.checkpoint`` with its policy; returns the undo.
        ``strict=False`` for a model run under ``torch.compile`` (see :meth:`RegionPolicy.policy_fn`)."""
        undo = []
        for name, region in self.regions.items():
            module = model.get_submodule(name)
            original = module.forward
            module.forward = functools.partial(_checkpointed, original, region.context_fn(strict))  # type: ignore[method-assign]
            undo.append((module, original))

        def restore() -> None:
            for module, original in undo:
                module.forward = original  # type: ignore[method-assign]

        return restore

    @contextlib.contextmanager
    def applied(self, model: torch.nn.Module, *, strict: bool = True) -> Iterator[torch.nn.Module]:
        """``apply`` for the duration of a ``with`` block."""
        restore = self.apply(model, strict=strict)
        try:
            yield model
        finally:
            restore()

    def summary(self) -> dict[str, Any]:
        """Calls per policy over all regions, and the counts of what is lost."""
        total: Counter[str] = Counter()
        unmatched: Counter[str] = Counter()
        for region in self.regions.values():
            total.update(region.counts())
            unmatched.update(region.unmatched)
        return {"regions": len(self.regions), "calls": dict(total), "unmatched": dict(unmatched),
                "lost": {k: len(v) for k, v in self.lost.items()}}


def _checkpointed(forward: Callable[..., Any], context_fn: Callable[[], tuple[Any, Any]], *args: Any,
                  **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, context_fn=context_fn, **kwargs)


def block_regions(model: torch.nn.Module) -> list[str]:
    """The children of every ``nn.ModuleList`` (a transformer's blocks), outermost lists only."""
    names: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and not any(name.startswith(n + ".") for n in names):
            names.extend(f"{name}.{child}" if name else child for child, _ in module.named_children())
    return names


def _in_region(path: str, regions: list[str]) -> str | None:
    return next((r for r in regions if path == r or path.startswith(r + ".")), None)


def _forward_nodes(traced: TracedStep) -> list[torch.fx.Node]:
    out = []
    for node in traced.gm.graph.nodes:
        if node.op == "call_function":
            out.append(node)
        if node.name == traced.loss_node:
            return out
    raise SacExportError(f"model '{traced.model}': loss node '{traced.loss_node}' not in the traced graph")


#: when a kernel's outputs are decided differently (a layer norm's output recomputed, its mean kept), the one
#: call SAC sees gets the first of these: a recompute reruns the kernel for every output, a save keeps them all
_PRECEDENCE = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.MUST_CPU_OFFLOAD, CheckpointPolicy.MUST_SAVE,
               CheckpointPolicy.PREFER_RECOMPUTE)


def _node_policies(planned: PlannedModule, swap_policy: CheckpointPolicy) -> tuple[dict[str, CheckpointPolicy], TracedStep]:
    """The plan's decision for each forward fx node, made per planned op (a kernel's output with its views,
    which share its storage): recompute, offload, save (read by backward or by a rerun op), or nothing to keep."""
    step = planned.step
    if len(step.stages) != 1:
        raise SacExportError(f"model '{step.traced.model}': a SAC export is of a one-stage plan, not {len(step.stages)}")
    stage = step.stages[0]
    members = {op["id"]: op["nodes"] for op in stage.raw["ops"]}
    kernel = {op.id: op.of or op.id for op in stage.problem.ops}
    computes = Counter(o for kind, o in stage.events if kind == "compute")
    swapped = {o for kind, o in stage.events if kind == "swap_out"}
    recomputed = {o for o, c in computes.items() if c > 1}
    rerun_nodes = {n for o in recomputed for n in members[o]}
    forward = _forward_nodes(step.traced)
    forward_names = {n.name for n in forward}
    by_name = {n.name: n for n in forward}

    def read_later(op: str) -> bool:
        group = set(members[op])
        return any(u.name not in group and (u.name not in forward_names or u.name in rerun_nodes)
                   for n in members[op] if n in by_name for u in by_name[n].users)

    decided: dict[str, CheckpointPolicy] = {}
    for op in members:
        if op in recomputed:
            policy = CheckpointPolicy.MUST_RECOMPUTE
        elif op in swapped:
            policy = swap_policy
        elif read_later(op):
            policy = CheckpointPolicy.MUST_SAVE
        else:
            policy = CheckpointPolicy.PREFER_RECOMPUTE  # freed in forward: nothing to keep
        k = kernel.get(op, op)
        if k not in decided or _rank(policy, swap_policy) < _rank(decided[k], swap_policy):
            decided[k] = policy
    return {n: decided[kernel.get(op, op)] for op, ns in members.items() for n in ns if n in by_name}, step.traced


def _rank(policy: CheckpointPolicy, swap_policy: CheckpointPolicy) -> int:
    return _PRECEDENCE.index(CheckpointPolicy.MUST_CPU_OFFLOAD if policy == swap_policy else policy)


def sac_policy(planned: PlannedModule, regions: list[str] | None = None, *,
               swap_policy: CheckpointPolicy = CheckpointPolicy.MUST_CPU_OFFLOAD) -> SacExport:
    """``planned``'s plan as SAC policies over ``regions`` (module names of ``planned.model``; default
    :func:`block_regions`), leaving out a region where the plan recomputes and swaps nothing (checkpointing it
    would rerun its unsaved calls for nothing: autograd keeps what the plan keeps there). Raises SacExportError for a plan with the optimizer in it (its updates cannot be
    exported: plan without ``optimizer=``) or with more than one stage, and for an unknown region."""
    if planned.updates is not None:
        raise SacExportError("a plan with the optimizer in the step cannot be exported as SAC (the updates run "
                             "inside backward); export the plan made without optimizer=")
    model = planned.model
    chosen = block_regions(model) if regions is None else list(regions)
    known = dict(model.named_modules())
    unknown = [r for r in chosen if r not in known or r == ""]
    if unknown:
        raise SacExportError(f"regions {unknown[:3]} are not submodules of {type(model).__name__}")
    policies, traced = _node_policies(planned, swap_policy)
    calls: dict[str, dict[Any, list[CheckpointPolicy]]] = {r: defaultdict(list) for r in chosen}
    nodes: dict[str, dict[Any, list[str]]] = {r: defaultdict(list) for r in chosen}
    lost: dict[str, list[str]] = defaultdict(list)
    for node in _forward_nodes(traced):
        if not isinstance(node.target, torch._ops.OpOverload) or node.target in SAC_IGNORED_OPS:
            continue  # getitem and the ops SAC lets through unrecorded
        policy = policies.get(node.name, CheckpointPolicy.PREFER_RECOMPUTE)
        region = _in_region(module_path(node), chosen)
        if region is None:
            if node.target is linear_cross_entropy._opoverload:
                lost["chunked loss head (the model computes its own)"].append(node.name)
            if policy in (CheckpointPolicy.MUST_RECOMPUTE, swap_policy):
                lost[f"{policy.name.lower()} outside every region"].append(node.name)
            continue
        calls[region][node.target].append(policy)
        nodes[region][node.target].append(node.name)
    acting = (CheckpointPolicy.MUST_RECOMPUTE, swap_policy)
    return SacExport({r: RegionPolicy(r, dict(calls[r]), dict(nodes[r])) for r in chosen
                      if any(p in acting for ps in calls[r].values() for p in ps)}, dict(lost))
