"""The training step with the optimizer in it: an fx pass placing one ``trainplan::optimizer_step`` node per
parameter, and the check that a schedule of it reads every parameter before its update.

Each update goes right after the later of the parameter's complete gradient and the last node that reads
the parameter (directly or through a view, as a tied weight's transpose), the earliest point that leaves the
step's values as they were; the step then returns the loss alone, and each gradient is freed once its update
has run. The schedule problem keeps recomputes from crossing an update (``schedule.stage_problem``); a
schedule that still computes an op reading a parameter after the parameter's update (it would read the new
value) is refused by :func:`check_update_order`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainplan.execute.plan import PlanError
from trainplan.export.tables import GraphTables
from trainplan.export.trace import TracedStep
from trainplan.loop.update_op import optimizer_step

UPDATE_PREFIX = "optimizer_step_"  # an update node's name: the prefix and the parameter's index


def _param_readers(tables: GraphTables) -> dict[str, set[str]]:
    """Each parameter placeholder -> the nodes that read its storage (through any view of it)."""
    tensors = tables.tensors
    storage_of = dict(zip(tensors.tensor_id, tensors.storage))
    params = tensors.loc[tensors.kind == "parameter", ["tensor_id", "storage"]]
    readers: dict[int, set[str]] = {int(sid): set() for sid in params.storage}
    for row in tables.nodes.itertuples():
        for tid in row.inputs:
            if storage_of[tid] in readers:
                readers[storage_of[tid]].add(row.name)
    return {str(t): readers[int(sid)] for t, sid in zip(params.tensor_id, params.storage)}


def _unused(grad: torch.fx.Node, placeholder: torch.fx.Node) -> bool:
    """The zero gradient the step makes for a parameter the loss does not depend on (eager leaves it None)."""
    return grad.target is torch.ops.aten.zeros_like.default and grad.args[0] is placeholder


def with_updates(traced: TracedStep, tables: GraphTables) -> TracedStep:
    """``traced`` (returning ``(loss, *grads)``) with each parameter's update placed in its backward; the new
    step returns ``(loss,)``. A parameter the loss does not use gets no update (as in eager, where its
    gradient is None)."""
    old = traced.gm.graph
    placeholders = [n for n in old.nodes if n.op == "placeholder"]
    output = next(n for n in old.nodes if n.op == "output")
    loss, *grads = output.args[0]
    order = {n.name: i for i, n in enumerate(old.nodes)}
    readers = _param_readers(tables)
    after: dict[str, list[int]] = {}  # node name -> parameter indices updated right after it
    for i, (ph, grad) in enumerate(zip(placeholders, grads)):
        if _unused(grad, ph):
            continue
        last = max([grad.name, *readers[ph.name]], key=order.__getitem__)
        after.setdefault(last, []).append(i)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in old.nodes:
        if node.op == "output":
            continue
        env[node] = graph.node_copy(node, env.__getitem__)
        for i in after.get(node.name, ()):
            update = graph.create_node("call_function", optimizer_step._opoverload,
                                       (env[placeholders[i]], env[grads[i]], i), name=f"{UPDATE_PREFIX}{i}")
            update.meta["val"] = None
    graph.output((env[loss],))
    gm = torch.fx.GraphModule(traced.gm, graph, class_name="StepWithUpdates")
    return TracedStep(traced.model, gm, traced.param_names, traced.buffer_names, traced.batch_names, traced.loss_node)


def check_update_order(ops: Sequence[dict], events: Sequence[tuple[str, str]], tables: GraphTables,
                       *, where: str) -> None:
    """Raise PlanError where ``events`` (of a stage whose problem ops are ``ops``) compute an op that reads a
    parameter after that parameter's update."""
    op_of = {node: op["id"] for op in ops for node in op["nodes"]}
    placeholders = tables.tensors.loc[tables.tensors.kind == "parameter", "tensor_id"].tolist()
    readers = _param_readers(tables)
    stale_after: dict[str, set[str]] = {}  # update op -> ops reading its parameter
    for op in ops:
        for node in op["nodes"]:
            if node.startswith(UPDATE_PREFIX):
                read_by = readers[placeholders[int(node.removeprefix(UPDATE_PREFIX))]]
                stale_after[op["id"]] = {op_of[r] for r in read_by if r in op_of} - {op["id"]}
    updated: dict[str, str] = {}  # op -> the update after which it may not run
    for pos, (kind, oid) in enumerate(events):
        if kind != "compute":
            continue
        if oid in updated:
            raise PlanError(f"{where}: event {pos} recomputes '{oid}', which reads a parameter already updated by "
                            f"'{updated[oid]}' (it would read the new value)")
        updated.update(dict.fromkeys(stale_after.get(oid, ()), oid))
