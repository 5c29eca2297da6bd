"""Where every value of the traced graph lives: fx node outputs (slots) mapped to plan storages and ops."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch

from trainplan.aten_ops import is_inplace
from trainplan.execute.plan import StagePlan
from trainplan.export.memory import FIXED_KINDS

#: one tensor value of the graph: (fx node name, element index; -1 for a node returning one tensor)
Slot = tuple[str, int]


def _slot(tensor_id: str, node: str) -> Slot:
    return (node, -1) if tensor_id == node else (node, int(tensor_id.rsplit(".", 1)[1]))


@dataclass
class GraphLayout:
    """Slots of every fx node, the plan storage of each slot, and the real tensors of fixed storages."""

    nodes: dict[str, torch.fx.Node]
    slots: dict[str, list[tuple[int, int]]]  # node -> [(element index, storage id)]
    storage: dict[Slot, int]
    producer: dict[int, str]  # storage -> fx node that allocates it (a later slot on it is a view)
    fixed: dict[int, torch.Tensor]  # fixed storage id -> a real placeholder tensor on it
    placeholders: dict[str, torch.Tensor]  # graph inputs and lifted constants (get_attr), by node name

    @classmethod
    def build(cls, gm: torch.fx.GraphModule, flat: list[torch.Tensor], tensors: pd.DataFrame) -> GraphLayout:
        graph_nodes = {n.name: n for n in gm.graph.nodes}
        ph = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        placeholders = dict(zip(ph, flat))
        placeholders.update((n.name, getattr(gm, str(n.target))) for n in gm.graph.nodes if n.op == "get_attr")
        slots: dict[str, list[tuple[int, int]]] = {}
        storage: dict[Slot, int] = {}
        producer: dict[int, str] = {}
        fixed: dict[int, torch.Tensor] = {}
        fixed_ids = set(tensors.loc[tensors.kind.isin(FIXED_KINDS), "storage"])
        for t in tensors.itertuples():
            slot = _slot(str(t.tensor_id), str(t.node))
            sid = int(t.storage)
            storage[slot] = sid
            slots.setdefault(slot[0], []).append((slot[1], sid))
            producer.setdefault(sid, slot[0])
            if sid in fixed_ids and slot[0] in placeholders:
                fixed.setdefault(sid, placeholders[slot[0]])
        return cls(graph_nodes, slots, storage, producer, fixed, placeholders)


@dataclass
class OpSpec:
    """One problem op as the executor sees it: the fx nodes it runs and the storages it holds."""

    id: str
    nodes: list[torch.fx.Node]
    storages: tuple[int, ...]
    bytes: int
    boundary: bool


@dataclass
class StageLayout:
    """A stage's ops, which op holds each storage, and the fixed storages its nodes read."""

    index: int
    ops: dict[str, OpSpec]
    holder: dict[int, str]  # storage -> op id
    fixed: set[int]
    exported: set[int] = field(default_factory=set)  # storages another stage receives
    sends: dict[str, tuple[int, ...]] = field(default_factory=dict)  # op id -> exported storages handed off after it
    allocation: str | None = None  # the device type whose allocation sizes the plan weighs storages at, if any

    @classmethod
    def build(cls, stage: StagePlan, layout: GraphLayout) -> StageLayout:
        ops: dict[str, OpSpec] = {}
        holder: dict[int, str] = {}
        for raw in stage.raw["ops"]:
            spec = OpSpec(raw["id"], [layout.nodes[n] for n in raw["nodes"]], tuple(int(s) for s in raw["storages"]),
                          int(raw["bytes"]), bool(raw.get("boundary", False)))
            ops[spec.id] = spec
            holder.update((sid, spec.id) for sid in spec.storages)
        fixed = {  # read directly or through a view another stage made (a tied weight's transpose)
            sid
            for op in ops.values()
            for node in op.nodes
            for a in node.all_input_nodes
            for _, sid in layout.slots.get(a.name, ())
            if sid in layout.fixed
        }
        return cls(stage.index, ops, holder, fixed, allocation=stage.raw.get("allocation"))


def stage_layouts(stages: list[StagePlan], layout: GraphLayout) -> list[StageLayout]:
    """Layouts of all stages, with the storages each stage hands to a later one marked ``exported`` and the op
    after whose compute it hands each off (``sends``, see :func:`_senders`)."""
    out = [StageLayout.build(st, layout) for st in stages]
    for st in out:
        for op in st.ops.values():
            if op.boundary:
                for other in out:
                    if other is not st:
                        other.exported.update(
                            s for s in op.storages if s in other.holder and not other.ops[other.holder[s]].boundary
                        )
    position = {name: i for i, name in enumerate(layout.nodes)}  # program order of the fx nodes
    first_read = _first_reads(out, layout, position)
    for st in out:
        st.sends = _senders(st, layout, position, first_read)
    return out


def _first_reads(stages: list[StageLayout], layout: GraphLayout, position: dict[str, int]) -> dict[int, int]:
    """Per storage a stage receives: the program position of the first node that reads it there."""
    first: dict[int, int] = {}
    for st in stages:
        received = {sid for op in st.ops.values() if op.boundary for sid in op.storages}
        for op in st.ops.values():
            for node in [] if op.boundary else op.nodes:
                for a in node.all_input_nodes:
                    for _, sid in layout.slots.get(a.name, ()):
                        if sid in received:
                            first[sid] = min(first.get(sid, position[node.name]), position[node.name])
    return first


def _senders(st: StageLayout, layout: GraphLayout, position: dict[str, int],
             first_read: dict[int, int]) -> dict[str, tuple[int, ...]]:
    """For each storage ``st`` exports, the op whose compute completes the value a receiving stage reads: the
    op holding it, or the last op of ``st`` that writes into it in place before the receiver's first read (a
    residual ``add_`` on a batch norm's output): sent at the holder's compute, the receiver would read the
    value from before that write."""
    last: dict[int, tuple[int, str]] = {}  # storage -> (position, op) of that write
    for op in st.ops.values():
        for node in [] if op.boundary else op.nodes:
            pos = position[node.name]
            for _, sid in layout.slots.get(node.name, ()) if is_inplace(str(node.target)) else ():
                if sid in st.exported and last.get(sid, (-1, ""))[0] < pos < first_read.get(sid, -1):
                    last[sid] = (pos, op.id)
    sends: dict[str, list[int]] = {}
    for sid in sorted(st.exported):
        sends.setdefault(last[sid][1] if sid in last else st.holder[sid], []).append(sid)
    return {op_id: tuple(sids) for op_id, sids in sends.items()}
