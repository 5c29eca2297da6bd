"""The user's optimizer applied one parameter at a time, as the plan's ``optimizer_step`` ops run, and what
those updates cost: their time is profiled with the step, their optimizer state and temporaries measured here.

Each update hands the optimizer that one parameter's gradient and calls its ``step()``: a torch optimizer
steps only the parameters that have a gradient, so the other parameters and their state stay as they are,
and the optimizer's param groups, learning-rate schedulers and ``state_dict`` keep working as in eager.
Updating a parameter alone gives the same values as a step over all of them for every per-parameter
optimizer (SGD, Adam, AdamW, ...). Steps that need every gradient at once cannot run in backward and are
refused: LBFGS (it re-evaluates the loss); global-norm clipping and gradient accumulation (docs/plan_api.md).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainplan.execute.measure import peak_during


class ParamUpdates:
    """``update(index, grad)``: ``optimizer`` steps ``params[index]`` with ``grad``, alone."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter],
                 names: Sequence[str]) -> None:
        if isinstance(optimizer, torch.optim.LBFGS):
            raise ValueError("LBFGS re-evaluates the loss within its step: it cannot update parameters one at a "
                             "time in backward; plan without optimizer=")
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        missing = [n for n, p in zip(names, params) if id(p) not in held and p.requires_grad]
        if missing:
            raise ValueError(f"the optimizer does not hold parameter(s) {missing[:3]} of the model: with the optimizer "
                             "in the plan, every trained parameter is updated by it")
        self.optimizer = optimizer
        self.params = list(params)
        self.names = list(names)
        self.trained = [p.requires_grad for p in params]

    def clear(self) -> None:
        """Drop every gradient the optimizer could see, so that each step updates only the parameter given."""
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                p.grad = None

    def __call__(self, index: int, grad: torch.Tensor) -> None:
        if not self.trained[index]:
            return
        p = self.params[index]
        p.grad = grad
        try:
            type(self.optimizer).step(self.optimizer)  # the class's step: a scheduler's wrapper counts user calls
        finally:
            p.grad = None


def scratch_updates(updates: ParamUpdates) -> ParamUpdates:
    """A copy of ``updates`` on copies of the parameters and of the optimizer's state, for profiling: running
    it changes nothing of the user's (planning holds both copies for its duration)."""
    memo: dict[int, object] = {}
    optimizer = copy.deepcopy(updates.optimizer, memo)
    params = [memo[id(p)] if id(p) in memo else torch.nn.Parameter(p.detach().clone(), requires_grad=False)
              for p in updates.params]  # a parameter the optimizer does not hold is not trained
    return ParamUpdates(optimizer, params, updates.names)  # type: ignore[arg-type]


@dataclass(frozen=True)
class UpdateCosts:
    """Bytes the optimizer holds (its state, resident across steps) and each update's temporaries."""

    state_bytes: int
    workspace_bytes: list[int]  # per parameter, in the step's parameter order


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in the optimizer's state (Adam's moments, SGD's momentum buffers, ...)."""
    return int(sum(t.untyped_storage().nbytes() for state in optimizer.state.values() for t in state.values()
                   if isinstance(t, torch.Tensor)))


def update_costs(scratch: ParamUpdates, device: torch.device) -> UpdateCosts:
    """The scratch optimizer's state after a step of every parameter, and the most each update allocates on
    top of it (measured once per parameter shape and dtype, on the step's device)."""
    for i, p in enumerate(scratch.params):  # the state exists from the first step on
        scratch(i, torch.randn_like(p))
    measured: dict[tuple[torch.Size, torch.dtype], int] = {}
    workspace = []
    for i, p in enumerate(scratch.params):
        shape = (p.shape, p.dtype)
        if shape not in measured:
            grad = torch.randn_like(p)
            _, peak = peak_during(lambda: scratch(i, grad), device)  # noqa: B023 (run at once)
            if peak is None:
                raise RuntimeError(f"parameter '{scratch.names[i]}': the allocator's peak during its update cannot "
                                   "be measured here (no profiler event tree); plan without optimizer=")
            measured[shape] = peak
        workspace.append(measured[shape] if scratch.trained[i] else 0)
    return UpdateCosts(state_bytes(scratch.optimizer), workspace)
