"""Compile a plan into code: its events become straight-line nodes of one ``torch.fx.GraphModule``.

A compute runs the op's fx nodes (a recompute runs them again, as duplicated nodes); a free is a call
to :func:`free` taking every value on the op's storages, so that fx's generated code drops them right
after it (fx deletes each value after its last use); a swap-out copies a storage to the host
(:func:`swap_out`: numpy on the CPU, pinned memory on a side stream on CUDA) and a swap-in makes a fresh
device storage from that copy (:func:`swap_in`) and views it as the op's values. Stages (k > 1) run in
one module in the event interpreter's order (:func:`trainplan.execute.runner.execution_order`), each on
its own values; a storage another stage receives is copied when it is computed (:func:`send`) and
viewed by the receiving stage at its receive event. Values the plan
keeps to the end are taken by a last :func:`free`, so nothing is dropped earlier than the plan says.

The module takes the traced step's flat inputs and returns ``(loss, *grads)``. With ``probe``, it also
calls :func:`track` on every value it makes and :func:`event_done` after every event, which a
:class:`Probe` turns into the live storages and device bytes after each event (the interpreter's
``measure`` records, for checking one against the other); without it, no call sits between the ops
but the frees and swaps.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ContextManager

import torch
from torch.fx.node import map_arg
from torch.multiprocessing.reductions import StorageWeakRef

from trainplan import direct_kernels
from trainplan.execute.layout import GraphLayout, Slot, StageLayout
from trainplan.execute.pool import clone_storage
from trainplan.execute.runner import ExecutionError, execution_order
from trainplan.execute.state import rerun
from trainplan.export.traced_step import is_view_node
from trainplan.host_swap import HostCopy, from_host, to_host
from trainplan.memory_model import storage_weight

#: (dtype, storage offset, size, stride) of a slot's tensor, from the trace
SlotMeta = tuple[torch.dtype, int, tuple[int, ...], tuple[int, ...]]

_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream | None:
    if device.type != "cuda":
        return None
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device)
    return _STREAMS[device]


def free(*values: Any) -> None:
    """The point where a plan frees storages: the generated code drops ``values`` right after this call."""


def swap_out(t: torch.Tensor) -> HostCopy:
    """A host copy of the whole storage under ``t``."""
    return to_host(t.untyped_storage(), _side_stream(t.device))


def swap_in(copy: HostCopy, device: torch.device) -> torch.UntypedStorage:
    """A fresh device storage holding a host copy's bytes."""
    return from_host(copy, device, _side_stream(device))


def view(storage: torch.UntypedStorage, dtype: torch.dtype, offset: int, size: tuple[int, ...],
         stride: tuple[int, ...]) -> torch.Tensor:
    """A tensor over ``storage`` with the given layout."""
    return torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, size, stride)


def send(t: torch.Tensor) -> torch.UntypedStorage:
    """A copy of the storage under ``t`` for the stage that receives it (which counts it from its receive)."""
    return clone_storage(t.untyped_storage(), t.device)


def zeros_broadcast(dtype: torch.dtype, size: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Zeros of ``size`` held as one broadcast element: a stand-in read in place of a storage never sent."""
    return torch.zeros((), dtype=dtype, device=device).expand(size)


def hand_over(t: torch.Tensor) -> torch.UntypedStorage:
    """The storage under ``t`` itself, for a sender that copies it on the way (a pipeline's carrier)."""
    return t.untyped_storage()


@dataclass
class Probe:
    """Live storages per stage, recorded after every event of a probed compiled run, each weighed as its stage's
    plan weighs it (``allocation``: the device type of its allocation sizes, ``memory_model.storage_weight``)."""

    fixed: list[dict[int, int]]  # per stage: data pointer -> weight of the fixed storages it reads
    allocation: list[str | None]  # per stage: the device type its plan weighs storages at (None: data bytes)
    tracked: list[list[tuple[StorageWeakRef, int, int, int]]] = field(default_factory=list)  # (ref, ptr, bytes, sid)
    after: list[tuple[int, int, int, frozenset[int]]] = field(default_factory=list)  # (stage, pos, bytes, sids)

    def __post_init__(self) -> None:
        self.tracked = [[] for _ in self.fixed]

    def track(self, t: Any, stage: int, sid: int) -> None:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            self.tracked[stage].append((StorageWeakRef(st), st.data_ptr(),
                                        storage_weight(self.allocation[stage], st.nbytes()), sid))

    def event_done(self, stage: int, position: int) -> None:
        live = [x for x in self.tracked[stage] if not x[0].expired()]
        self.tracked[stage] = live
        held = dict(self.fixed[stage])
        held.update((ptr, nbytes) for _, ptr, nbytes, _ in live)
        sids = frozenset(sid for _, ptr, _, sid in live if ptr not in self.fixed[stage])
        self.after.append((stage, position, int(sum(held.values())), sids))


_PROBES: list[Probe] = []


def track(t: Any, stage: int, sid: int) -> None:
    """Probe hook: a value a stage made, on plan storage ``sid``."""
    if _PROBES:
        _PROBES[-1].track(t, stage, sid)


def event_done(stage: int, position: int) -> None:
    """Probe hook: a stage's event is done."""
    if _PROBES:
        _PROBES[-1].event_done(stage, position)


@dataclass
class Clock:
    """Wall time of a clocked compiled run, per (stage position, communication?) segment."""

    sync: Any = None  # called before each reading (CUDA), None on the CPU
    totals: dict[tuple[int, bool], float] = field(default_factory=dict)
    last: tuple[tuple[int, bool], int] | None = None

    def tick(self, stage: int, communication: bool) -> None:
        if self.sync is not None:
            self.sync()
        now = time.perf_counter_ns()
        if self.last is not None:
            label, start = self.last
            self.totals[label] = self.totals.get(label, 0.0) + (now - start) / 1e9
        self.last = ((stage, communication), now) if stage >= 0 else None

    def stage_seconds(self, stage: int, communication: bool = False) -> float:
        return self.totals.get((stage, communication), 0.0)


_CLOCKS: list[Clock] = []


def tick(stage: int, communication: bool) -> None:
    """Clock hook: a segment of a stage's events starts (stage -1: the run ends)."""
    if _CLOCKS:
        _CLOCKS[-1].tick(stage, communication)


@contextmanager
def _routed(stack: list, hook: Any) -> Iterator[Any]:
    """Route the hooks of compiled modules run inside to ``hook`` (the innermost one wins)."""
    stack.append(hook)
    try:
        yield hook
    finally:
        stack.pop()


def clocking(clock: Clock) -> ContextManager[Clock]:
    """Route the clock hooks of compiled modules run inside to ``clock``."""
    return _routed(_CLOCKS, clock)


def probing(probe: Probe) -> ContextManager[Probe]:
    """Route the probe hooks of compiled modules run inside to ``probe``."""
    return _routed(_PROBES, probe)


def slot_meta(node: torch.fx.Node, idx: int) -> SlotMeta:
    """The traced layout of one tensor value of a node."""
    val = node.meta["val"] if idx < 0 else node.meta["val"][idx]
    return val.dtype, int(val.storage_offset()), tuple(val.shape), tuple(val.stride())


@dataclass
class _Stage:
    """What the compiler tracks of one stage: the current graph value of each slot, non-tensor values,
    storages resident and pending (further kernel outputs, held from the kernel's first compute until their
    own op takes them right after), host copies."""

    layout: StageLayout
    env: dict[Slot, torch.fx.Node] = field(default_factory=dict)
    scalars: dict[str, Any] = field(default_factory=dict)
    resident: set[int] = field(default_factory=set)
    pending: dict[int, str] = field(default_factory=dict)  # storage -> op whose kernel made it
    computed: set[str] = field(default_factory=set)
    host: dict[int, torch.fx.Node] = field(default_factory=dict)


class PlanCompiler:
    """Emits the code of stages' events into one fx graph (``graph``), each stage on its own values."""

    def __init__(self, gm: torch.fx.GraphModule, layout: GraphLayout, stages: list[StageLayout],
                 device: torch.device, probe: bool, clocked: bool,
                 handed_over: frozenset[int] = frozenset(), zero_stand_ins: frozenset[int] = frozenset()) -> None:
        """``handed_over``: storages sent as they are (:func:`hand_over`), not copied at the send (:func:`send`):
        for code whose caller copies what it sends, so that the storage is not held twice meanwhile.
        ``zero_stand_ins``: storages received as zeros (:func:`zeros_broadcast`, each of its values), not on a
        channel: a tied weight's partial gradient that a pipeline adds once per step instead; an addition of
        such zeros to a value of the result's shape is that value (no storage of its own)."""
        self.gm, self.layout, self.device, self.probe, self.clocked = gm, layout, device, probe, clocked
        self.handed_over, self.zero_stand_ins = handed_over, zero_stand_ins
        self._zeros: set[torch.fx.Node] = set()  # values of zero stand-ins
        self.segment: tuple[int, bool] | None = None
        self.graph = torch.fx.Graph()
        self.stages = [_Stage(st) for st in stages]
        self.inputs: dict[str, torch.fx.Node] = {}
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                self.inputs[node.name] = self.graph.placeholder(node.name)
            elif node.op == "get_attr":
                self.inputs[node.name] = self.graph.get_attr(str(node.target))
        self.channel: dict[int, torch.fx.Node] = {}  # storage -> the value a stage sends on it
        self.slots_on: dict[int, list[Slot]] = {}
        for slot, sid in layout.storage.items():
            self.slots_on.setdefault(sid, []).append(slot)
        self.where = ""

    def enter(self, stage: int, communication: bool) -> None:
        """With a clock, start a new timed segment where the stage or the kind of work changes."""
        if self.clocked and self.segment != (stage, communication):
            self._call(tick, stage, communication)
            self.segment = (stage, communication)

    # --- values -----------------------------------------------------------------------------------
    def _call(self, target: Any, *args: Any) -> torch.fx.Node:
        return self.graph.call_function(target, tuple(args))

    def _hold(self, st: _Stage, slot: Slot, value: torch.fx.Node) -> None:
        st.env[slot] = value
        if self.probe and self.layout.storage[slot] not in self.layout.fixed:
            self._call(track, value, self.stages.index(st), self.layout.storage[slot])

    def _value(self, st: _Stage, node: torch.fx.Node) -> Any:
        if node.name in self.inputs:
            return self.inputs[node.name]
        if node.name in st.scalars:
            return st.scalars[node.name]
        slot = (node.name, -1)
        sid = self.layout.storage.get(slot)
        base = None
        if slot not in st.env and sid in self.layout.fixed:  # made by another stage
            base = next(self.inputs[n] for n, _ in self.slots_on[sid] if n in self.inputs)
        elif slot not in st.env and is_view_node(node):
            # a view another stage's node makes of a storage this stage holds (a cut between an op and the views
            # of its output): viewed here, as the plan counts the storage
            base = next((st.env[s] for s in self.slots_on.get(sid, ()) if s in st.env), None)
        if base is not None:
            storage = self.graph.call_method("untyped_storage", (base,))
            self._hold(st, slot, self._call(view, storage, *slot_meta(node, -1)))
        if slot not in st.env:
            raise ExecutionError(f"{self.where}: node '{node.name}' reads a value that is not resident")
        return st.env[(node.name, -1)]

    def _emit(self, st: _Stage, node: torch.fx.Node, op_id: str, op_storages: tuple[int, ...], again: bool) -> None:
        """One fx node of a compute: a getitem takes the kernel output already made; any other node runs
        (``again``, in a recompute: leaving the step's fixed state as it is)."""
        slots = self.layout.slots.get(node.name)
        base = node.args[0] if node.target is operator.getitem else None
        if isinstance(base, torch.fx.Node) and isinstance(base.meta.get("val"), (tuple, list)):
            if not slots:  # an element that is not a tensor (an output the kernel was asked not to make)
                st.scalars[node.name] = base.meta["val"][int(node.args[1])]
                return
            source = (base.name, int(node.args[1]))
            if source not in st.env:  # an extra output whose kernel ran while it was held: run it again
                self._emit(st, self.layout.nodes[base.name], op_id, op_storages, again=True)
            self._hold(st, (node.name, -1), st.env[source])
            return
        args, kwargs = map_arg((node.args, node.kwargs), lambda a: self._value(st, a))
        how = rerun(node, self.layout) if again else None
        if how is not None and how.skip:  # an in-place update of fixed state: its result is that state
            if slots:
                self._hold(st, (node.name, -1), args[0])
            return
        if how is not None:
            args = tuple(self._call(torch.clone, a) if i in how.copies else a for i, a in enumerate(args))
        other = self._plus_zeros(node, args, kwargs)
        if other is not None and slots and slots[0][0] < 0:  # x + zeros is x: held as its value, no new storage
            self._hold(st, (node.name, -1), other)
            return
        out = self.graph.call_function(direct_kernels.kernel(node.target), args, kwargs)
        out.meta = dict(node.meta)
        if not slots:
            st.scalars[node.name] = out
            return
        if slots[0][0] < 0:
            self._hold(st, (node.name, -1), out)
            return
        for idx, sid in slots:
            own = self.layout.producer.get(sid) == node.name
            holder = st.layout.holder.get(sid)
            if sid in self.layout.fixed or not own or sid in op_storages or (
                    sid not in st.resident and holder not in st.computed):
                self._hold(st, (node.name, idx), self._call(operator.getitem, out, idx))
                if own and sid not in op_storages and sid not in self.layout.fixed:
                    st.pending[sid] = op_id

    def _plus_zeros(self, node: torch.fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """For ``aten.add.Tensor(x, z)`` (either order, no alpha) with ``z`` a zero stand-in and ``x`` of the
        result's shape and dtype: the value of ``x``; else None."""
        if node.target is not torch.ops.aten.add.Tensor or kwargs or len(args) != 2:
            return None
        val = node.meta.get("val")
        for x, z, source in ((args[0], args[1], node.args[0]), (args[1], args[0], node.args[1])):
            meta = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
            if z in self._zeros and meta is not None and val is not None and meta.shape == val.shape \
                    and meta.dtype == val.dtype:
                return x
        return None

    # --- events -----------------------------------------------------------------------------------
    def compute(self, st: _Stage, op_id: str) -> None:
        op = st.layout.ops[op_id]
        if op.boundary:
            own = {n.name for o in st.layout.ops.values() if not o.boundary for n in o.nodes}
            for sid in op.storages:  # viewed as every node of another stage on it (this stage reads some)
                for slot in self.slots_on[sid]:
                    if slot[0] in own:
                        continue
                    dtype, offset, size, stride = slot_meta(self.layout.nodes[slot[0]], slot[1])
                    if sid in self.zero_stand_ins:
                        value = self._call(zeros_broadcast, dtype, size, self.device)
                        self._zeros.add(value)
                    else:
                        value = self._call(view, self.channel[sid], dtype, offset, size, stride)
                    self._hold(st, slot, value)
        again = op_id in st.computed
        for node in op.nodes:
            self._emit(st, node, op_id, op.storages, again)
        for sid in op.storages:
            st.resident.add(sid)
            st.pending.pop(sid, None)
        for sid in st.layout.sends.get(op_id, ()):
            if sid not in self.channel:
                stage = self.stages.index(st)
                self.enter(stage, True)
                how = hand_over if sid in self.handed_over else send
                self.channel[sid] = self._call(how, st.env[next(s for s in self.slots_on[sid] if s in st.env)])
                self.enter(stage, op.boundary)
        st.computed.add(op_id)

    def _on(self, st: _Stage, sids: set[int]) -> list[Slot]:
        return [s for s in st.env if self.layout.storage[s] in sids]

    def free(self, st: _Stage, op_id: str) -> None:
        op = st.layout.ops[op_id]
        dropped = set(op.storages) | {s for s, owner in st.pending.items() if owner == op_id}
        slots = self._on(st, dropped)
        self._call(free, *dict.fromkeys(st.env.pop(s) for s in slots))
        st.resident -= dropped
        for sid in dropped:
            st.pending.pop(sid, None)

    def held(self, stage: int, node: torch.fx.Node) -> torch.fx.Node | None:
        """The graph value of tensor node ``node`` if the stage at position ``stage`` holds it now, else None."""
        return self.stages[stage].env.get((node.name, -1))

    def drop(self, stage: int, sids: set[int]) -> None:
        """Drop the values the stage at position ``stage`` holds on ``sids`` now, outside the plan's events
        (a caller that took them: a gradient added into its sum where made)."""
        st = self.stages[stage]
        self._call(free, *dict.fromkeys(st.env.pop(s) for s in self._on(st, sids)))

    def _save(self, st: _Stage, sid: int) -> None:
        source = next((s for s in self._on(st, {sid}) if s[0] == self.layout.producer[sid]), None) \
            or self._on(st, {sid})[0]
        st.host[sid] = self._call(swap_out, st.env[source])

    def swap_out(self, st: _Stage, op_id: str) -> None:
        op = st.layout.ops[op_id]
        for sid in op.storages:
            self._save(st, sid)

    def _restore(self, st: _Stage, sid: int, nodes: set[str]) -> None:
        storage = self._call(swap_in, st.host[sid], self.device)
        for slot in self.slots_on[sid]:
            if slot[0] in nodes or slot[0] == self.layout.producer[sid]:
                dtype, offset, size, stride = slot_meta(self.layout.nodes[slot[0]], slot[1])
                self._hold(st, slot, self._call(view, storage, dtype, offset, size, stride))

    def swap_in(self, st: _Stage, op_id: str) -> None:
        op = st.layout.ops[op_id]
        names = {n.name for n in op.nodes}
        for sid in op.storages:
            self._restore(st, sid, names)
            st.resident.add(sid)

    def event(self, stage: int, position: int, kind: str, op_id: str) -> None:
        """Emit event ``position`` (``kind`` on op ``op_id``) of the stage at position ``stage``."""
        self.where = f"stage {self.stages[stage].layout.index} event {position} {kind} '{op_id}'"
        _EVENTS[kind](self, self.stages[stage], op_id)

    def value(self, stage: int, node: torch.fx.Node) -> Any:
        """The graph value of ``node`` as the stage at position ``stage`` holds it now."""
        return self._value(self.stages[stage], node)

    def keep_to_end(self) -> None:
        """A last :func:`free` of every value still held, so that none is dropped before the code ends."""
        self._call(free, *dict.fromkeys(v for st in self.stages for v in st.env.values()))

    def finish(self) -> None:
        """Keep what the plan keeps to the end, then return the loss and gradients."""
        out_node = next(n for n in self.gm.graph.nodes if n.op == "output")
        owner = {n.name: st for st in self.stages for op in st.layout.ops.values() if not op.boundary for n in op.nodes}
        outputs = [self._value(owner.get(a.name, self.stages[0]), a) for a in out_node.args[0]]
        self.keep_to_end()
        if self.clocked:
            self._call(tick, -1, False)
        self.graph.output(tuple(outputs))


_EVENTS = {"compute": PlanCompiler.compute, "free": PlanCompiler.free, "swap_out": PlanCompiler.swap_out,
           "swap_in": PlanCompiler.swap_in}


@dataclass
class CompiledPlan:
    """The compiled module and the events it runs, as (stage position, event position), in order."""

    module: torch.fx.GraphModule
    order: list[tuple[int, int]]

    def __call__(self, *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            return self.module(*flat)


def compile_plan(gm: torch.fx.GraphModule, layout: GraphLayout, stages: list[StageLayout],
                 events: list[list[tuple[str, str]]], *, device: torch.device, probe: bool = False,
                 clocked: bool = False) -> CompiledPlan:
    """Straight-line code for the plan's events on the traced step ``gm``; raises ExecutionError naming the
    stage, event and node when an event reads a value the plan does not hold. ``probe``: calls that record
    the live storages after each event (:func:`probe_run`); ``clocked``: a clock reading wherever the running
    stage changes or a stage starts or ends communication (its events on received storages, and sending one),
    for :class:`Clock`."""
    c = PlanCompiler(gm, layout, stages, device, probe, clocked)
    order = execution_order(stages, events)
    for s, pos in order:
        kind, oid = events[s][pos]
        c.enter(s, stages[s].ops[oid].boundary)
        c.event(s, pos, kind, oid)
        if probe:
            c._call(event_done, s, pos)
    c.finish()
    return CompiledPlan(torch.fx.GraphModule(gm, c.graph, class_name="CompiledPlan"), order)


def clocked_run(plan: CompiledPlan, flat: list[torch.Tensor], device: torch.device) -> Clock:
    """Run a clocked compiled plan; the clock holds each stage's own and communication seconds."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    with clocking(Clock(sync)) as clock:
        plan(*flat)
    return clock


def probe_run(plan: CompiledPlan, layout: GraphLayout, stages: list[StageLayout],
              flat: list[torch.Tensor]) -> tuple[tuple[torch.Tensor, ...], Probe]:
    """Run a probed compiled plan; the probe holds live storage ids and device bytes after every event."""
    fixed = [{layout.fixed[sid].untyped_storage().data_ptr():
              storage_weight(st.allocation, layout.fixed[sid].untyped_storage().nbytes()) for sid in st.fixed}
             for st in stages]
    with probing(Probe(fixed, [st.allocation for st in stages])) as probe:
        out = plan(*flat)
    return out, probe
