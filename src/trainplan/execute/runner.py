"""Apply a plan's events to the real traced graph, one device pool per stage, measuring bytes and time.

``compute`` runs the op's fx nodes on real tensors (again, for a recompute); ``free`` drops its storages;
``swap_out`` copies them to the host pool; ``swap_in`` copies them back into fresh device storage.
Stages are interleaved as their data demand: a stage waits at a boundary op until the producing stage
has computed that storage, then receives a copy of it into its own pool.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch.fx.node import map_arg

from trainplan.execute.layout import GraphLayout, OpSpec, Slot, StageLayout
from trainplan.execute.pool import DevicePool, clone_storage
from trainplan.execute.state import rerun
from trainplan.host_swap import HostPool
from trainplan.memory_model import storage_weight

#: (dtype, storage offset, size, stride) of a slot, recorded when its node runs
SlotMeta = tuple[torch.dtype, int, tuple[int, ...], tuple[int, ...]]


class ExecutionError(RuntimeError):
    """A plan cannot be executed on the real graph; the message names the stage, event, op and node."""


@dataclass(slots=True)
class EventRecord:
    """One executed event: wall time and, in a measured run, device bytes after it and at its peak."""

    stage: int
    position: int
    kind: str
    op: str
    seconds: float
    bytes_after: int = -1
    bytes_peak: int = -1
    host_bytes: int = -1
    op_bytes: int = -1  # real bytes of the op's storages after a compute
    boundary: bool = False  # an event on a storage received from another stage (communication, not compute)
    unplanned: dict[str, int] = field(default_factory=dict)  # op -> bytes held for it outside the plan
    storages: frozenset[int] = frozenset()  # plan storages held after it (resident and pending)


@dataclass
class Shared:
    """State shared by the stages of one run: slot metadata and the storages sent between stages."""

    meta: dict[Slot, SlotMeta] = field(default_factory=dict)
    channel: dict[int, torch.UntypedStorage] = field(default_factory=dict)
    surprises: set[str] = field(default_factory=set)  # nodes the plan took for views that allocated
    regenerated: list[str] = field(default_factory=list)  # ops whose storage had to be re-made by its kernel


class StageRunner:
    """Executes one stage's events in order on its own device and host pools."""

    def __init__(self, stage: StageLayout, events: list[tuple[str, str]], layout: GraphLayout,
                 shared: Shared, device: torch.device, sync: Callable[[], None] | None) -> None:
        self.stage, self.events, self.layout, self.shared = stage, events, layout, shared
        self.device, self.sync = device, sync  # sync: None where nothing runs asynchronously (CPU)
        self.pool = DevicePool({sid: layout.fixed[sid].untyped_storage() for sid in stage.fixed},
                               allocation=stage.allocation)
        self.host = HostPool(device)
        self.scalars: dict[str, Any] = {}
        self.computed: set[str] = set()  # ops computed so far
        self.position = 0
        self._measuring = False
        self._peak = 0

    def waiting_for(self) -> str:
        kind, oid = self.events[self.position]
        return f"stage {self.stage.index} event {self.position} {kind} '{oid}'"

    def step(self, measure: bool) -> EventRecord:
        """Run the next event; with ``measure``, record device bytes after every node and after the event."""
        kind, oid = self.events[self.position]
        op = self.stage.ops[oid]
        record = EventRecord(self.stage.index, self.position, kind, oid, 0.0, boundary=op.boundary)
        self._measuring = measure
        self._peak = 0
        start = time.perf_counter_ns()
        try:
            _HANDLERS[kind](self, op)
        except ExecutionError:
            raise
        except Exception as exc:
            raise ExecutionError(f"{self.waiting_for()}: {type(exc).__name__}: {exc}") from exc
        if self.sync is not None:
            self.sync()
        record.seconds = (time.perf_counter_ns() - start) / 1e9
        if measure:
            record.bytes_after = self.pool.device_bytes()
            record.bytes_peak = max(self._peak, record.bytes_after)
            record.host_bytes = self.host.nbytes()
            record.unplanned = self._unplanned()
            record.storages = frozenset(self.pool.resident) | frozenset(self.pool.pending)
            if kind == "compute":
                held = {self.pool.resident[s].data_ptr(): self.pool.resident[s].nbytes()
                        for s in op.storages if s in self.pool.resident}
                record.op_bytes = int(sum(held.values()))
        self.position += 1
        return record

    def _unplanned(self) -> dict[str, int]:
        """Bytes held outside the plan's accounting: pending extra kernel outputs and views that allocated."""
        out: dict[str, int] = {}
        for sid, (st, _) in self.pool.pending.items():
            op = self.stage.holder.get(sid, f"storage {sid}")
            out[op] = out.get(op, 0) + st.nbytes()
        for (node, _), (t, _) in self.pool.extras.items():
            out[f"view {node}"] = t.untyped_storage().nbytes()
        return out

    # --- events -------------------------------------------------------------------------------
    def _compute(self, op: OpSpec) -> None:
        if op.boundary:
            for sid in op.storages:
                self.pool.put(sid, clone_storage(self.shared.channel[sid], self.device))
        for sid in op.storages:
            if sid in self.pool.pending:
                self.pool.put(sid, self.pool.pending[sid][0])
        again = op.id in self.computed
        for node in op.nodes:
            self._run_node(node, op, again)
        for sid in op.storages:
            if sid not in self.pool.resident:  # an extra output whose kernel ran while it was held: run it again
                self.shared.regenerated.append(op.id)
                self._run_node(self.layout.nodes[self.layout.producer[sid]], op, again=True)
        for sid in self.stage.sends.get(op.id, ()):
            self.shared.channel.setdefault(sid, self.pool.resident[sid])
        self.computed.add(op.id)

    def _free(self, op: OpSpec) -> None:
        """Drop the op's storages and the extra kernel outputs still pending on it."""
        for sid in op.storages:
            self.pool.drop(sid)
        self.pool.drop_pending_of(op.id)

    def _swap_out(self, op: OpSpec) -> None:
        for sid in op.storages:
            self.host.save(sid, self.pool.resident[sid])

    def _swap_in(self, op: OpSpec) -> None:
        for sid in op.storages:
            self.pool.put(sid, self.host.load(sid))

    # --- values -------------------------------------------------------------------------------
    def _run_node(self, node: torch.fx.Node, op: OpSpec, again: bool) -> None:
        """Run ``node`` on real tensors; ``again`` (a recompute) leaves the step's fixed state as it is."""
        how = rerun(node, self.layout) if again else None
        if how is not None and how.skip:  # its result is the fixed storage, read where it lies
            return
        args, kwargs = map_arg((node.args, node.kwargs), self.value)
        if how is not None:
            args = tuple(a.clone() if i in how.copies else a for i, a in enumerate(args))
        out = cast(Callable[..., Any], node.target)(*args, **kwargs)
        del args, kwargs
        slots = self.layout.slots.get(node.name)
        if not slots:
            self.scalars[node.name] = out
            return
        if self._measuring:
            self._peak = max(self._peak, self.pool.device_bytes() + self._unheld_bytes(out))
        for idx, sid in slots:
            t = out if idx < 0 else out[idx]
            if isinstance(t, torch.Tensor):
                self._place(node.name, idx, sid, t, op)
        del out
        if self._measuring:
            self._peak = max(self._peak, self.pool.device_bytes())

    def _unheld_bytes(self, out: Any) -> int:
        """Bytes of fresh output storages of a kernel that the pool does not hold yet."""
        values = out if isinstance(out, (tuple, list)) else [out]
        held = self.pool.held()
        fresh = {t.untyped_storage().data_ptr(): storage_weight(self.pool.allocation, t.untyped_storage().nbytes())
                 for t in values if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in held}
        return int(sum(fresh.values()))

    def _place(self, name: str, idx: int, sid: int, t: torch.Tensor, op: OpSpec) -> None:
        """Hold a node's output where the plan says: in its op's storage, pending, or nowhere (a duplicate)."""
        if (name, idx) not in self.shared.meta:
            self.shared.meta[(name, idx)] = (t.dtype, int(t.storage_offset()), tuple(t.shape), tuple(t.stride()))
        if sid in self.layout.fixed:
            return
        st = t.untyped_storage()
        held = self.pool.storage(sid)
        if held is not None and held.data_ptr() == st.data_ptr():
            self._remember(sid, (name, idx), t)  # a view or in-place result on a storage already held
            return
        if self.layout.producer[sid] != name:  # the plan has a view here, but the kernel allocated
            self.shared.surprises.add(name)
            self.pool.extras[(name, idx)] = (t, sid)
        elif sid in op.storages:
            self.pool.put(sid, st)
            self._remember(sid, (name, idx), t)
        elif sid not in self.pool.resident and self.stage.holder.get(sid) not in self.computed:
            # an extra output is held until its own op is computed; one whose op was computed already (a
            # recompute of the kernel: extra outputs are never recomputed) lives only while the kernel runs,
            # as the kernel op's workspace in the plan
            self.pool.pending[sid] = (st, op.id)

    def _remember(self, sid: int, slot: Slot, t: torch.Tensor) -> None:
        """Keep a node's own output as the cached view of its slot, so readers need not rebuild it."""
        if sid in self.pool.resident:
            self.pool.views.setdefault(sid, {})[slot] = t

    def value(self, node: torch.fx.Node) -> Any:
        """The real value of an fx node, rebuilt from the storages this stage holds."""
        if node.op in ("placeholder", "get_attr"):
            return self.layout.placeholders[node.name]
        if node.name in self.scalars:
            return self.scalars[node.name]
        slots = self.layout.slots.get(node.name)
        if slots is None:
            raise ExecutionError(f"{self.waiting_for()}: node '{node.name}' has no value")
        if slots[0][0] < 0:
            return self._view((node.name, -1), required=True)
        out: list[Any] = [None] * len(node.meta["val"])
        for idx, _ in slots:
            out[idx] = self._view((node.name, idx), required=False)
        return tuple(out)

    def _view(self, slot: Slot, required: bool) -> torch.Tensor | None:
        if slot in self.pool.extras:
            return self.pool.extras[slot][0]
        sid = self.layout.storage[slot]
        st = self.layout.fixed[sid].untyped_storage() if sid in self.layout.fixed else self.pool.storage(sid)
        if st is None:
            if required:
                holder = self.stage.holder.get(sid, "?")
                raise ExecutionError(f"{self.waiting_for()}: node '{slot[0]}' reads storage {sid} "
                                     f"(op '{holder}') that is not resident")
            return None
        cache = self.pool.views.setdefault(sid, {})
        view = cache.get(slot)
        if view is None:
            dtype, offset, size, stride = self.shared.meta[slot]
            view = torch.empty(0, dtype=dtype, device=st.device).set_(st, offset, size, stride)
            cache[slot] = view
        return view


#: event kind -> handler; a class-level table, so that a runner holds no bound methods of itself (a
#: reference cycle would keep its pools, and every storage in them, alive until the cyclic GC runs)
_HANDLERS: dict[str, Callable[[StageRunner, OpSpec], None]] = {
    "compute": StageRunner._compute, "free": StageRunner._free,
    "swap_out": StageRunner._swap_out, "swap_in": StageRunner._swap_in}


@dataclass
class RunResult:
    """Events executed (in execution order across stages) and the graph outputs (loss, gradients)."""

    records: list[EventRecord]
    outputs: list[torch.Tensor]
    shared: Shared
    runners: list[StageRunner]


def execution_order(stages: list[StageLayout], events: list[list[tuple[str, str]]]) -> list[tuple[int, int]]:
    """(stage position, event position) of every event in the order a run takes them: each stage goes as far
    as it can, round-robin, and waits at a boundary op until a stage has computed the storage it receives.
    Raises ExecutionError on a cycle, naming the waiting events."""
    produced: set[int] = set()
    pos = [0] * len(stages)
    order: list[tuple[int, int]] = []

    def blocked(s: int) -> bool:
        op = stages[s].ops[events[s][pos[s]][1]]
        return events[s][pos[s]][0] == "compute" and op.boundary and any(x not in produced for x in op.storages)

    while any(p < len(ev) for p, ev in zip(pos, events)):
        progressed = False
        for s, st in enumerate(stages):
            while pos[s] < len(events[s]) and not blocked(s):
                kind, oid = events[s][pos[s]]
                if kind == "compute":
                    produced.update(st.sends.get(oid, ()))
                order.append((s, pos[s]))
                pos[s] += 1
                progressed = True
        if not progressed:
            waits = "; ".join(f"stage {stages[s].index} event {pos[s]} {events[s][pos[s]][0]} '{events[s][pos[s]][1]}'"
                              for s in range(len(stages)) if pos[s] < len(events[s]))
            raise ExecutionError(f"deadlock: every stage waits for a storage no stage has produced ({waits})")
    return order


def run_plan(stages: list[StageLayout], events: list[list[tuple[str, str]]], layout: GraphLayout,
             gm: torch.fx.GraphModule, *, device: torch.device, measure: bool = False) -> RunResult:
    """Execute every stage's events in :func:`execution_order`."""
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    shared = Shared()
    runners = [StageRunner(st, ev, layout, shared, device, sync) for st, ev in zip(stages, events)]
    with torch.no_grad():
        records = [runners[s].step(measure) for s, _ in execution_order(stages, events)]
        outputs = _outputs(gm, stages, runners)
    return RunResult(records, outputs, shared, runners)


def _outputs(gm: torch.fx.GraphModule, stages: list[StageLayout], runners: list[StageRunner]) -> list[torch.Tensor]:
    """Loss and gradients, read from the stage that holds each (all are kept resident to the end)."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    owner = {node.name: r for st, r in zip(stages, runners) for op in st.ops.values() if not op.boundary
             for node in op.nodes}
    values = []
    for arg in out_node.args[0]:
        runner = owner.get(arg.name, runners[0])
        values.append(runner.value(arg))
    return values
