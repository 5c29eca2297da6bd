"""Where every value of the traced graph lives: fx node outputs (slots) mapped to plan storages and ops."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch

from trainplan.execute.plan import StagePlan
from trainplan.memory import FIXED_KINDS

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
    internal: tuple[int, ...] = ()  # a fused group's storages made and freed within its compute


@dataclass
class StageLayout:
    """A stage's ops, which op holds each storage, and the fixed storages its nodes read."""

    index: int
    ops: dict[str, OpSpec]
    holder: dict[int, str]  # storage -> op id
    fixed: set[int]
    exported: set[int] = field(default_factory=set)  # storages another stage receives

    @classmethod
    def build(cls, stage: StagePlan, layout: GraphLayout) -> StageLayout:
        ops: dict[str, OpSpec] = {}
        holder: dict[int, str] = {}
        for raw in stage.raw["ops"]:
            spec = OpSpec(raw["id"], [layout.nodes[n] for n in raw["nodes"]], tuple(int(s) for s in raw["storages"]),
                          int(raw["bytes"]), bool(raw.get("boundary", False)),
                          tuple(int(s) for s in raw.get("internal", ())))
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
        return cls(stage.index, ops, holder, fixed)


def stage_layouts(stages: list[StagePlan], layout: GraphLayout) -> list[StageLayout]:
    """Layouts of all stages, with the storages each stage hands to a later one marked ``exported``."""
    out = [StageLayout.build(st, layout) for st in stages]
    for st in out:
        for op in st.ops.values():
            if op.boundary:
                for other in out:
                    if other is not st:
                        other.exported.update(
                            s for s in op.storages if s in other.holder and not other.ops[other.holder[s]].boundary
                        )
    return out
