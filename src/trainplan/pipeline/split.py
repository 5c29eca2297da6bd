"""One pipeline stage's planned events split at its forward/backward boundary into two fx modules.

The split event is the stage's first backward event: the first compute of an op whose node the trace marks
backward, or the receipt of a storage a later stage sends (which a pipeline has only in its backward pass).
The forward half runs the events before it, the backward half the rest, both compiled by
:class:`trainplan.execute.compile.PlanCompiler` as the single-process step is. The stash is what the plan holds
at the split: every value the forward half made (or received) that a later event reads -- resident storages,
host copies of swapped ones, storages still to be sent back -- handed over as it is; a recompute after the split
reads its inputs from there, as in the single-process step. A storage the next stage receives must be sent
before the split (PipelineError naming the op otherwise). Stages exchange storages with their neighbours only: a
storage read two or more stages away is relayed, received and sent on unchanged by every stage between (in its
forward half going forward, in its backward half going back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainplan.aten_ops import is_inplace
from trainplan.execute.compile import PlanCompiler
from trainplan.execute.layout import GraphLayout, StageLayout
from trainplan.export.trace import TracedStep
from trainplan.pipeline.errors import PipelineError


def take(values: list[Any], index: int) -> Any:
    """Hand over ``values[index]``, leaving None, so that the caller's list keeps nothing alive; a callable there
    makes the value now (a storage received for the backward half is made at the plan's receive event)."""
    value, values[index] = values[index], None
    return value() if callable(value) else value


def split_here() -> None:
    """Marks the split event in a stage's code (never called: the mark is removed when the code is split)."""


@dataclass(frozen=True)
class Flows:
    """Plan storages that cross each link between neighbouring stages: ``(sender, receiver) -> sorted storage
    ids``, relayed storages included on every link they cross."""

    storages: dict[tuple[int, int], tuple[int, ...]]

    def between(self, sender: int, receiver: int) -> tuple[int, ...]:
        return self.storages.get((sender, receiver), ())


def stage_flows(layouts: list[StageLayout], layout: GraphLayout, model: str) -> Flows:
    """Which storages cross each link: a storage stage ``b`` reads from stage ``a`` crosses every link from ``a``
    to ``b`` (relayed by the stages between). A storage no stage makes raises PipelineError naming its node."""
    owner = {sid: s for s, st in enumerate(layouts) for op in st.ops.values() if not op.boundary for sid in op.storages}
    flows: dict[tuple[int, int], set[int]] = {}
    for receiver, st in enumerate(layouts):
        for op in st.ops.values():
            for sid in op.storages if op.boundary else ():
                sender = owner.get(sid)
                if sender is None or sender == receiver:
                    raise PipelineError(
                        f"model '{model}': stage {receiver} receives storage {sid} of node '{layout.producer[sid]}', "
                        f"made by {'no stage' if sender is None else 'itself'}")
                step = 1 if receiver > sender else -1
                for a in range(sender, receiver, step):
                    flows.setdefault((a, a + step), set()).add(sid)
    return Flows({pair: tuple(sorted(sids)) for pair, sids in flows.items()})


@dataclass
class StageHalves:
    """A stage's code in two halves.

    ``forward(*flat, live, sink)`` -> ``(*sent_forward, [loss], *stash)``; ``backward(*flat, live, sink)`` ->
    ``(*sent_backward, *returned gradients)``. ``flat`` are the traced step's inputs (parameters, buffers,
    batch); ``live`` is a list the half takes its values from (:func:`take`): the storages received (forward:
    from the previous stage, taken at the start; backward: from the next, each taken at the plan's event
    receiving it), then, for the backward half, the stash. The storages sent are the halves' own (the caller
    packs copies), except those the stage writes in place, copied at the send. The gradients in ``summed``
    (parameter positions) and the tied partials in ``summed_partials`` (storages; None in their place among
    those sent back) are added into ``sink`` as soon as they are made (``sink.add_param(position, value)``,
    ``sink.add_partial(sid, storage)``: :class:`trainplan.pipeline.stage.StageSink`), not returned: in the
    forward half where a forward kernel makes them (the chunked loss head's weight gradient).
    """

    index: int
    forward: torch.fx.GraphModule
    backward: torch.fx.GraphModule
    received_forward: tuple[int, ...]
    received_backward: tuple[int, ...]
    sent_forward: tuple[int, ...]
    sent_backward: tuple[int, ...]
    has_loss: bool
    grads: tuple[int, ...]  # parameter positions whose gradients the stage makes, in order
    split_event: int
    stash_values: int
    summed: frozenset[int] = frozenset()  # of grads: added into .grad where made
    summed_partials: frozenset[int] = frozenset()  # of sent_backward: added into their running sums where made

    @property
    def returned(self) -> tuple[int, ...]:
        """Parameter positions whose gradients the backward half returns, in order."""
        return tuple(i for i in self.grads if i not in self.summed)


def _phase_of(op_id: str, st: StageLayout, layout: GraphLayout, phase: dict[str, str]) -> str:
    op = st.ops[op_id]
    return phase.get(layout.producer[op.storages[0]], "forward") if op.storages else "forward"


def split_event(st: StageLayout, events: list[tuple[str, str]], layout: GraphLayout, phase: dict[str, str],
                later: set[int]) -> int:
    """Position of the stage's first backward event (``later``: storages it receives from the next stage)."""
    for pos, (kind, oid) in enumerate(events):
        op = st.ops[oid]
        if kind != "compute":
            continue
        if op.boundary and later.intersection(op.storages):
            return pos
        if not op.boundary and _phase_of(oid, st, layout, phase) == "backward":
            return pos
    raise PipelineError(f"stage {st.index}: no backward event (a stage of a training step runs backward ops)")


def split_stage(traced: TracedStep, layout: GraphLayout, layouts: list[StageLayout],
                events: list[tuple[str, str]], position: int, flows: Flows, phase: dict[str, str], *,
                device: torch.device, summed: frozenset[int] = frozenset(),
                zero_stand_ins: frozenset[int] = frozenset()) -> StageHalves:
    """The halves of the stage at ``position`` (of ``layouts``) running its planned ``events``. ``summed``: plan
    storages of gradients (parameters', and tied partials this stage sends back) added into their sums where
    made (:mod:`trainplan.schedule.grad_accumulation`): taken from the plan's values right after the event making
    them. ``zero_stand_ins``: tied partials received back as zeros (reduced once per step)."""
    st, k = layouts[position], len(layouts)
    recv_fwd = flows.between(position - 1, position)
    recv_bwd = flows.between(position + 1, position)
    send_fwd = flows.between(position, position + 1)
    send_bwd = flows.between(position, position - 1)
    cut = split_event(st, events, layout, phase, set(recv_bwd))
    # the carriers copy what a stage sends: the halves hand their storages over uncopied, but for a storage
    # the stage writes in place (a copy at the send keeps the value the receiver reads)
    written = {sid for op in st.ops.values() if not op.boundary for n in op.nodes if is_inplace(str(n.target))
               for _, sid in layout.slots.get(n.name, ())}
    handed = frozenset(send_fwd + send_bwd) - written
    c = PlanCompiler(traced.gm, layout, [st], device, False, False, handed_over=handed,
                     zero_stand_ins=zero_stand_ins)
    flat = [c.inputs[n.name] for n in traced.gm.graph.nodes if n.op == "placeholder"]
    live_fwd = c.graph.placeholder("live_forward")
    live_bwd = c.graph.placeholder("live_backward")
    sink = c.graph.placeholder("gradient_sink")
    for i, sid in enumerate(recv_fwd):
        c.channel[sid] = c.graph.call_function(take, (live_fwd, i))
    nodes = {n.name: n for n in traced.gm.graph.nodes}
    out_args = next(n for n in traced.gm.graph.nodes if n.op == "output").args[0]
    own = {n.name for op in st.ops.values() if not op.boundary for n in op.nodes}
    has_loss = traced.loss_node in own
    if has_loss and position != k - 1:
        raise PipelineError(f"model '{traced.model}': the loss node '{traced.loss_node}' is in stage {position}, "
                            f"not in the last stage {k - 1}")
    loss = marker = None
    late_index = {sid: i for i, sid in enumerate(recv_bwd)}
    grads = tuple(i for i, a in enumerate(out_args[1:]) if isinstance(a, torch.fx.Node) and a.name in own)
    to_sum = {i: out_args[1 + i] for i in grads if layout.storage.get((out_args[1 + i].name, -1)) in summed}
    summed_params = frozenset(to_sum)
    partials_to_sum = {sid for sid in send_bwd if sid in summed}
    summed_partials = frozenset(partials_to_sum)
    for pos, (kind, oid) in enumerate(events):
        if pos == cut:
            loss = c.value(0, nodes[traced.loss_node]) if has_loss else None
            marker = c.graph.call_function(split_here)
        if pos >= cut and kind == "compute" and st.ops[oid].boundary:  # taken at the plan's receive event
            for sid in st.ops[oid].storages:
                if sid in late_index and sid not in c.channel and sid not in zero_stand_ins:
                    c.channel[sid] = c.graph.call_function(take, (live_bwd, late_index[sid]))
        c.event(0, pos, kind, oid)
        if kind == "compute" and (to_sum or partials_to_sum):
            _sum_made(c, sink, to_sum, partials_to_sum)
    if to_sum or partials_to_sum:
        raise PipelineError(f"model '{traced.model}': stage {position} never makes the gradient(s) "
                            f"{sorted([n.name for n in to_sum.values()] + [str(s) for s in partials_to_sum])}")
    for sid, i in late_index.items():  # received but never read by the plan: taken (and dropped) at the end
        if sid not in c.channel:
            c.channel[sid] = c.graph.call_function(take, (live_bwd, i))
    grad_values = [c.value(0, out_args[1 + i]) for i in grads if i not in summed_params]
    c.keep_to_end()
    order = {n: i for i, n in enumerate(c.graph.nodes)}
    late = [sid for sid in send_fwd if order[c.channel[sid]] > order[marker]]
    if late:
        sender = next(op for op, sids in st.sends.items() if late[0] in sids)
        raise PipelineError(f"model '{traced.model}': stage {position} sends storage {late[0]} (op '{sender}') to "
                            f"stage {position + 1} only after its first backward event {cut} {events[cut]}: the "
                            "plan's forward part does not produce what the next stage's forward reads")
    fwd_out = [c.channel[sid] for sid in send_fwd] + ([loss] if has_loss else [])
    bwd_out = [None if sid in summed_partials else c.channel[sid] for sid in send_bwd] + grad_values
    forward, backward, stash = _split_graph(traced.gm, c.graph, marker, flat, (live_fwd, live_bwd, sink),
                                            fwd_out, bwd_out, len(recv_bwd))
    return StageHalves(st.index, forward, backward, recv_fwd, recv_bwd, send_fwd, send_bwd, has_loss, grads, cut,
                       stash, summed_params, summed_partials)


def _sum_made(c: PlanCompiler, sink: torch.fx.Node, params: dict[int, torch.fx.Node], partials: set[int]) -> None:
    """After a compute: each gradient of ``params`` (position -> output node) and each tied partial of
    ``partials`` (storages sent back) now made is added into ``sink`` and dropped from the plan's values (both
    emptied of what was summed)."""
    for i, node in list(params.items()):
        value = c.held(0, node)
        if value is not None:
            c.graph.call_method("add_param", (sink, i, value))
            c.drop(0, {c.layout.storage[(node.name, -1)]})
            del params[i]
    for sid in [s for s in partials if s in c.channel]:
        c.graph.call_method("add_partial", (sink, sid, c.channel.pop(sid)))
        c.drop(0, {sid})
        partials.discard(sid)


def _split_graph(root: torch.fx.GraphModule, graph: torch.fx.Graph, marker: torch.fx.Node,
                 flat: list[torch.fx.Node], live: tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node],
                 fwd_out: list[torch.fx.Node], bwd_out: list[Any],
                 n_received: int) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule, int]:
    """``graph`` cut at ``marker``: the nodes before it, returning ``fwd_out`` and the stash (values made before
    the cut and read after it), and the nodes after it, taking the stash from its live list after the
    ``n_received`` received storages. ``live``: the forward half's live list, the backward half's and its
    gradient sink (a placeholder of both halves)."""
    nodes = list(graph.nodes)
    cut = nodes.index(marker)
    before, after = nodes[:cut], nodes[cut + 1:]
    inputs = set(flat) | set(live)
    attrs = [n for n in before if n.op == "get_attr"]
    early = set(before) - inputs - set(attrs)
    stash = list(dict.fromkeys([a for n in after for a in n.all_input_nodes if a in early]
                               + [v for v in bwd_out if v in early]))

    fg = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {n: fg.placeholder(n.name) for n in [*flat, live[0], live[2]]}
    for n in before:
        if n not in env and n not in live:
            env[n] = fg.node_copy(n, env.__getitem__)
    fg.output(tuple(env[v] for v in [*fwd_out, *stash]))

    bg = torch.fx.Graph()
    benv: dict[torch.fx.Node, torch.fx.Node] = {n: bg.placeholder(n.name) for n in [*flat, *live[1:]]}
    for n in attrs:
        benv[n] = bg.node_copy(n, benv.__getitem__)
    for i, v in enumerate(stash):
        benv[v] = bg.call_function(take, (benv[live[1]], n_received + i))
    for n in after:
        benv[n] = bg.node_copy(n, benv.__getitem__)
    bg.output(tuple(benv[v] if isinstance(v, torch.fx.Node) else v for v in bwd_out))
    return (torch.fx.GraphModule(root, fg, class_name="StageForward"),
            torch.fx.GraphModule(root, bg, class_name="StageBackward"), len(stash))
