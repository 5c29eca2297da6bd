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

#: a parameter above this many bytes is updated in row chunks of at most this many, where the optimizer is
#: elementwise (ELEMENTWISE): its temporaries are then chunk-sized (AdamW's are two parameter-sized tensors: 294 MiB
#: for GPT-2 small's tied embedding, the floor of its planned step); smaller chunks hold less and call the
#: optimizer's ``step()`` more often (each call is Python work over the param groups: ~0.1 ms)
CHUNK_BYTES = 16 * 2**20
#: optimizers whose update of an entry reads only that entry of the parameter, gradient and state (and scalars
#: from the step count), so that updating the rows apart gives the same values; exact types (a subclass may not be)
ELEMENTWISE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.NAdam,
               torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Adagrad)


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
        rows = chunk_rows(self.optimizer, p)
        if rows is not None:
            self._step_rows(p, grad, rows)
            return
        p.grad = grad
        try:
            self._step()
        finally:
            p.grad = None

    def _step(self) -> None:
        type(self.optimizer).step(self.optimizer)  # the class's step: a scheduler's wrapper counts user calls

    def _step_rows(self, p: torch.nn.Parameter, grad: torch.Tensor, rows: int) -> None:
        """Step ``p`` ``rows`` rows at a time: each chunk a Parameter on ``p``'s rows, alone in ``p``'s param group,
        with its state the rows of ``p``'s (scalars such as the step count copied in, and the last chunk's kept).
        On the first step the optimizer makes each chunk's state, copied into ``p``'s as it comes."""
        group = next(g for g in self.optimizer.param_groups if any(q is p for q in g["params"]))
        members, state = group["params"], self.optimizer.state
        full: dict = state.pop(p, {})
        made = bool(full)  # else the first step: each chunk's state is made by the optimizer
        before = dict(full)  # every chunk starts from the scalars (the step count) as they were
        try:
            for start in range(0, p.shape[0], rows):
                chunk = torch.nn.Parameter(p.detach()[start:start + rows])
                chunk.grad = grad[start:start + rows]
                if made:
                    state[chunk] = {k: v[start:start + rows] if _rowwise(v, p) else
                                    v.clone() if isinstance(v, torch.Tensor) else v for k, v in before.items()}
                group["params"] = [chunk]
                self._step()
                for k, v in state.pop(chunk, {}).items():
                    if not _rowwise(v, chunk):
                        full[k] = v
                        continue
                    if k not in full:
                        full[k] = torch.empty(p.shape, dtype=v.dtype, device=v.device)
                    target = full[k][start:start + rows]
                    if target.data_ptr() != v.data_ptr():
                        target.copy_(v)
        finally:
            group["params"] = members
            if full:
                state[p] = full


def chunk_rows(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> int | None:
    """Rows per chunk of ``p``'s update (CHUNK_BYTES), or None where it is updated whole: a small or
    non-contiguous parameter, or an optimizer not in ELEMENTWISE."""
    size = p.numel() * p.element_size()
    if type(optimizer) not in ELEMENTWISE or size <= CHUNK_BYTES or p.dim() == 0 or not p.is_contiguous():
        return None
    row = size // p.shape[0]
    return max(1, CHUNK_BYTES // max(row, 1))


def _rowwise(value: object, p: torch.Tensor) -> bool:
    """Whether an optimizer state entry is per entry of ``p`` (its shape), not a scalar or other value."""
    return isinstance(value, torch.Tensor) and value.shape == p.shape


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
