"""Tied parameters' partial gradients reduced once per step instead of once per micro-batch.

A weight read by two stages (GPT-2's token embedding, read again by the LM head) gets its gradient as a sum of
partials: the traced step adds the later stage's partial into the earlier stage's gradient, so per micro-batch
the partial (50257 x 768 floats, 154 MB, for GPT-2 small) would travel back in the carrier, and the carrier, one
shape both ways, would carry that many bytes forward too. A pipeline reduces such a weight once per step instead
(Megatron's embedding group): the producing stage sums its partials over the micro-batches, the receiving stage's
addition reads zeros (one zero broadcast to the partial's shape, no storage of its size), and after the
schedule's step the sum is sent once and added, scaled by 1/m as PipelineStage scales the rest.

A partial qualifies (:func:`tied_partials`) when the gradient of a parameter is ``aten.add.Tensor`` of a value on
a storage a later stage makes (or ``trainplan::embedding_grad_add`` into it: an embedding's rows added into the
partial, ``export.embedding_grads``), that storage is read by nothing else (views of it aside), and the value is the
parameter's shape, contiguous from offset 0, in its dtype (so the sum is the parameter's gradient's shape).
The gradient then equals the single-process step's up to float round-off (the micro-batches' terms are summed
in another order); every other gradient stays bit-identical.
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from trainplan.aten_ops import GRADIENT_SUMS
from trainplan.execute.layout import GraphLayout, StageLayout
from trainplan.export.trace import TracedStep


@dataclass(frozen=True)
class TiedPartial:
    """The partial gradient on plan storage ``storage``: made by stage ``producer``, added into parameter
    ``param``'s gradient (position in the traced step's inputs) by stage ``receiver`` < ``producer``."""

    storage: int
    producer: int
    receiver: int
    param: int
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


def _storages(layout: GraphLayout, node: torch.fx.Node) -> set[int]:
    return {sid for _, sid in layout.slots.get(node.name, ())}


def _read(layout: GraphLayout, node: torch.fx.Node) -> set[int]:
    """Storages ``node`` reads: a getitem of a kernel with several outputs reads only the output it takes."""
    base = node.args[0] if node.target is operator.getitem else None
    if isinstance(base, torch.fx.Node) and isinstance(base.meta.get("val"), (tuple, list)):
        return {sid for idx, sid in layout.slots.get(base.name, ()) if idx == node.args[1]}
    return {sid for a in node.all_input_nodes for sid in _storages(layout, a)}


def tied_partials(traced: TracedStep, flat: list[torch.Tensor], layout: GraphLayout, layouts: list[StageLayout],
                  storage_bytes: dict[int, int]) -> dict[int, TiedPartial]:
    """The partial gradients a pipeline of ``layouts`` may reduce once per step, by storage (see the module);
    ``flat``: the traced step's inputs, parameters first."""
    owner = {sid: s for s, st in enumerate(layouts) for op in st.ops.values() if not op.boundary for sid in op.storages}
    stage_of = {n.name: s for s, st in enumerate(layouts) for op in st.ops.values() if not op.boundary
                for n in op.nodes}
    readers: dict[int, set[str]] = {}
    for node in traced.gm.graph.nodes:
        for sid in _read(layout, node):
            readers.setdefault(sid, set()).add(node.name)
    grads = next(n for n in traced.gm.graph.nodes if n.op == "output").args[0][1:1 + len(traced.param_names)]
    out: dict[int, TiedPartial] = {}
    for i, grad in enumerate(grads):
        terms = GRADIENT_SUMS.get(str(grad.target), 0) if isinstance(grad, torch.fx.Node) else 0
        if not terms or grad.name not in stage_of:
            continue
        param = flat[i]
        for arg in grad.args[:terms]:
            if not isinstance(arg, torch.fx.Node) or len(_storages(layout, arg)) != 1:
                continue
            (sid,) = _storages(layout, arg)
            receiver, producer = stage_of[grad.name], owner.get(sid)
            if producer is None or producer <= receiver or any(
                    sid in _storages(layout, a) for a in grad.args if isinstance(a, torch.fx.Node) and a is not arg):
                continue
            views = {name for name, slots in layout.slots.items() if any(s == sid for _, s in slots)}
            val = arg.meta.get("val")
            if (readers.get(sid, set()) - views - {grad.name}) or val is None or tuple(val.shape) != tuple(
                    param.shape) or val.dtype != param.dtype or not val.is_contiguous() or val.storage_offset() != 0 \
                    or storage_bytes[sid] != param.numel() * param.element_size():
                continue
            out[sid] = TiedPartial(sid, producer, receiver, i, traced.param_names[i], tuple(param.shape), param.dtype)
    return out


@dataclass
class TiedReduction:
    """One rank's part in reducing ``partials`` once per step: it sums those its ``stages`` make over the
    micro-batches (:meth:`accumulate`, :meth:`add`), and :meth:`reduce` sends or adds the sums after the schedule's
    step (stage s runs on rank s mod ``world``). ``send_s``, ``receive_s``: the last reduce's wall time sending
    (from the rank's own step end: waiting for the receiver included) and receiving (or taking its own) and
    adding."""

    stages: frozenset[int]
    world: int
    partials: dict[int, TiedPartial]
    device: torch.device
    sums: dict[int, torch.Tensor] = field(default_factory=dict)
    send_s: float = 0.0
    receive_s: float = 0.0

    def accumulate(self, sids: tuple[int, ...], storages: list[torch.UntypedStorage | None]) -> None:
        """Add the partials among ``storages`` (``sids``, what a backward half sends back: its own storages, no
        copies; None for one it summed where made) that this rank makes."""
        for sid, st in zip(sids, storages, strict=True):
            p = self.partials.get(sid)
            if p is not None and p.producer in self.stages and st is not None:
                self.add(sid, st)

    def add(self, sid: int, storage: torch.UntypedStorage) -> None:
        """Add the partial on ``storage`` (plan storage ``sid``, made by this rank) into its running sum; the first
        becomes the sum."""
        p = self.partials[sid]
        value = torch.empty(0, dtype=p.dtype, device=storage.device).set_(storage, 0, p.shape)
        if sid in self.sums:
            self.sums[sid].add_(value)
        else:
            self.sums[sid] = value

    def reduce(self, params: dict[int, torch.Tensor], m: int) -> None:
        """After the schedule's step: each producer sends its sum to the receiver (or, on the same rank, hands it
        over), which adds sum / m into the parameter's gradient (``params``: the parameters whose gradients this
        rank's stages compute, by input position)."""
        self.send_s = self.receive_s = 0.0
        for sid, p in sorted(self.partials.items()):
            t0 = time.perf_counter()
            makes, takes = p.producer in self.stages, p.receiver in self.stages
            if makes and not takes:
                dist.send(self.sums.pop(sid), p.receiver % self.world)
                self.send_s += time.perf_counter() - t0
            elif takes:
                if makes:
                    total = self.sums.pop(sid)
                else:
                    total = torch.empty(p.shape, dtype=p.dtype, device=self.device)
                    dist.recv(total, p.producer % self.world)
                param = params[p.param]
                total.div_(m)
                param.grad = total if param.grad is None else param.grad.add_(total)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                self.receive_s += time.perf_counter() - t0
