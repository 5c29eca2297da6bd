"""A planned stage as an ``nn.Module`` for ``torch.distributed.pipelining``: its forward is an autograd Function
running the stage's forward half (:mod:`trainplan.pipeline.split`), whose backward runs the backward half on the
stash the forward half left; PipelineStage and the schedules run it unchanged."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.pipelining import PipelineStage

from trainplan.pipeline.carrier import Carrier
from trainplan.pipeline.errors import PipelineError
from trainplan.pipeline.split import StageHalves
from trainplan.pipeline.tied import TiedReduction


@dataclass(frozen=True)
class Action:
    """One compute call: ``kind`` F (forward) or B (backward) of ``micro_batch`` through ``stage``, clock readings."""

    kind: str
    micro_batch: int
    stage: int
    start: float
    end: float


@dataclass
class HalfTimes:
    """Wall seconds of a rank's stage halves (summed over its stages and micro-batches) and in PipelineStage's
    compute calls, and each compute call in the order it ran."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    compute_s: float = 0.0
    actions: list[Action] = field(default_factory=list)

    def reset(self) -> None:
        self.forward_s = self.backward_s = self.compute_s = 0.0
        self.actions = []


@dataclass
class StageRuntime:
    """What the autograd Function of one stage needs: its halves, carriers in and out, where it runs, and its part
    in reducing tied parameters' partial gradients once per step (None: they travel in the carriers)."""

    halves: StageHalves
    carrier_in: Carrier | None  # from the previous stage (None on the first)
    carrier_out: Carrier | None  # to the next stage (None on the last)
    device: torch.device
    tied: TiedReduction | None = None
    times: HalfTimes = field(default_factory=HalfTimes)

    def clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def add_into_grad(param: torch.Tensor, value: torch.Tensor) -> None:
    """Add ``value`` into ``param.grad`` as autograd's AccumulateGrad does: the first one becomes ``.grad`` (a copy
    where it is a view into a larger or differently laid-out storage), the next ones are added in place."""
    if param.grad is not None:
        param.grad.add_(value)
    elif value.is_contiguous() and value.storage_offset() == 0 and \
            value.untyped_storage().nbytes() == value.numel() * value.element_size():
        param.grad = value.detach()
    else:
        param.grad = value.detach().clone(memory_format=torch.contiguous_format)


@dataclass
class StageSink:
    """Where a stage's halves add the gradients they sum where made: ``params``, the step's inputs (a
    parameter's gradient goes into its ``.grad``), and ``tied``, the rank's running sums of tied partials."""

    params: Sequence[torch.Tensor]
    tied: TiedReduction | None

    def add_param(self, position: int, value: torch.Tensor) -> None:
        add_into_grad(self.params[position], value)

    def add_partial(self, sid: int, storage: torch.UntypedStorage) -> None:
        if self.tied is None:
            raise PipelineError(f"tied partial on storage {sid} summed where made, but no tied reduction runs")
        self.tied.add(sid, storage)


class _PlannedHalves(torch.autograd.Function):
    """forward: the stage's forward half on the received carrier and the step's flat inputs; backward: its backward
    half on the stash, returning the carrier's gradient (the storages sent back) and the parameters' gradients."""

    @staticmethod
    def forward(ctx: Any, rt: StageRuntime, carrier: torch.Tensor | None, *flat: torch.Tensor) -> torch.Tensor:
        t0 = rt.clock()
        h = rt.halves
        received = rt.carrier_in.unpack(carrier, backward=False) if rt.carrier_in is not None else []
        out = list(h.forward(*flat, received, StageSink(flat, rt.tied)))
        n = len(h.sent_forward)
        sent, rest = out[:n], out[n:]
        del out
        if h.has_loss:
            result = rest.pop(0).detach().clone()
        else:
            assert rt.carrier_out is not None
            result = rt.carrier_out.pack(sent, backward=False, device=rt.device)
        del sent
        ctx.rt, ctx.stash, ctx.flat, ctx.has_carrier = rt, rest, flat, carrier is not None
        rt.times.forward_s += rt.clock() - t0
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        rt: StageRuntime = ctx.rt
        t0 = rt.clock()
        h = rt.halves
        if h.has_loss and not torch.equal(grad, torch.ones_like(grad)):
            raise PipelineError(f"stage {h.index}: the loss got gradient {grad.item()}; the plan seeds its backward "
                                "with 1 (a schedule that scales the loss is not supported)")
        received = rt.carrier_out.unpack(grad, backward=True) if rt.carrier_out is not None else []
        live, ctx.stash = [*received, *ctx.stash], None
        del received
        out = list(h.backward(*ctx.flat, live, StageSink(ctx.flat, rt.tied)))
        n = len(h.sent_backward)
        if rt.tied is not None:  # the partials not summed where made (None in the list)
            rt.tied.accumulate(h.sent_backward, out[:n])
        carrier_grad = rt.carrier_in.pack(out[:n], backward=True, device=rt.device) \
            if rt.carrier_in is not None and ctx.has_carrier else None
        grads: list[torch.Tensor | None] = [None] * len(ctx.flat)
        for i, g in zip(h.returned, out[n:], strict=True):
            grads[i] = g
        del out
        rt.times.backward_s += rt.clock() - t0
        return (None, carrier_grad, *grads)


class PlannedStageModule(torch.nn.Module):
    """``forward(*carrier, **micro_batch)``: the stage under its plan. Its parameters are those whose gradients
    the stage computes (PipelineStage scales them); the other parameters and buffers it reads are held as plain
    tensors. ``fixed``: the traced step's parameters and buffers, in order."""

    def __init__(self, rt: StageRuntime, fixed: list[torch.Tensor], batch_names: list[str]) -> None:
        super().__init__()
        self.rt, self.batch_names = rt, batch_names
        owned = set(rt.halves.grads)
        self.owned = torch.nn.ParameterList([fixed[i] for i in sorted(owned)])
        self.fixed = [t if i in owned else t.detach() for i, t in enumerate(fixed)]

    def forward(self, *carrier: torch.Tensor, **batch: torch.Tensor) -> torch.Tensor:
        missing = [n for n in self.batch_names if n not in batch]
        if missing:
            raise PipelineError(f"stage {self.rt.halves.index}: the micro-batch lacks {missing}")
        # a micro-batch is a slice of the batch: the plan's code views storages from offset 0, so copy it
        flat = [*self.fixed, *(batch[n].clone() for n in self.batch_names)]
        return _PlannedHalves.apply(self.rt, carrier[0] if carrier else None, *flat)


class TimedStage(PipelineStage):
    """PipelineStage adding the wall time of its compute calls (forward and backward of a micro-batch, autograd's
    gradient accumulation included; not the sends and receives the schedule makes) to ``times.compute_s``, and
    each call to ``times.actions``."""

    def __init__(self, *args: Any, times: HalfTimes, clock: Callable[[], float], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.times, self._clock = times, clock

    def _timed(self, kind: str, micro_batch: int, call: Callable[[], Any]) -> Any:
        t0 = self._clock()
        try:
            return call()
        finally:
            t1 = self._clock()
            self.times.compute_s += t1 - t0
            self.times.actions.append(Action(kind, micro_batch, self.stage_index, t0, t1))

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        return self._timed("F", fwd_chunk_id, lambda: super(TimedStage, self).forward_one_chunk(
            fwd_chunk_id, *args, **kwargs))

    def backward_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        return self._timed("B", bwd_chunk_id, lambda: super(TimedStage, self).backward_one_chunk(
            bwd_chunk_id, *args, **kwargs))
