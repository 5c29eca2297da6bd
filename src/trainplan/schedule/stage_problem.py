"""Turn a stage of a profiled graph into a scheduling problem (the dict format of docs/schedule.md).

The problem works on storages, not fx nodes: every node that allocates storage becomes one op whose
output is its first new storage, and each further new storage of a multi-output kernel becomes an op
``name#i`` (``of`` the first) that reads the first and may not be recomputed (no kernel recomputes one output
alone), taken as soon as the kernel first runs; the first op's ``workspace`` is the bytes of those further
outputs, which the kernel holds while it runs. A fused group's forward op (``trainplan.fuse.fused_ops``) is the
exception: its outputs and the tensors its backward saves are one op, since it is recomputed whole and a recompute
remakes them all (a plan may so drop a group's saved tensors after its forward and remake them for its backward).
View/alias nodes (no new storage) are folded into the op that produced their base, and their time is
added to it. An op whose storage a later node changes in place may be neither recomputed nor swapped.
Storages read by the stage but produced by another stage are boundary inputs: zero-time ops, placed
just before their first reader, that may not be recomputed (they are received, not computed). Storages the stage hands on (read by another stage, or graph outputs such as gradients and
the loss) are `keep`.
Each op lists its member fx nodes under ``nodes`` so a plan can be executed on the real graph, its ``phase``
(forward or backward: of the node making its storage; for a boundary input, of the other stage's node), and is
marked ``gradient`` when its storage is a graph output made in backward (a parameter's gradient) or a partial
gradient another stage adds into one (a tied weight): what a pipeline sums across micro-batches (``loss``: the
forward one, the loss, which a pipeline keeps per micro-batch); a boundary input that
is such a partial is marked ``tied_partial`` (a pipeline sends it once per step, not with each micro-batch).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from trainplan.aten_ops import GRADIENT_SUMS, PLAIN_SUM, RANDOM_OPS, is_inplace
from trainplan.budget import Budget, parse_budget
from trainplan.export.memory import FIXED_KINDS
from trainplan.memory_model import storage_weight
from trainplan.schedule.baselines import no_recompute
from trainplan.schedule.problem import problem_from_dict

#: ops a plan runs once per step: a random op (a recompute would draw anew) and an optimizer's update of a
#: parameter (``trainplan.loop.update_op``: a recompute would apply it twice)
OPTIMIZER_STEP = "trainplan.optimizer_step"
ONCE_PER_STEP = (*RANDOM_OPS, OPTIMIZER_STEP)
#: a fused group's forward op (``trainplan.fuse.fused_ops``: ``trainplan_fused.group_<digest>[_random]_fwd``);
#: ``_random``: the group holds a random op, so that a recompute would draw anew
FUSED_OPS, FUSED_FORWARD, FUSED_RANDOM = "trainplan_fused.", "_fwd.", "_random_fwd."


def _fused_forward(op: str) -> bool:
    return op.startswith(FUSED_OPS) and FUSED_FORWARD in op


def _storage_tables(tensors: pd.DataFrame, allocation: str | None) -> tuple[dict[str, int], set[int], dict[int, int]]:
    storage_of = dict(zip(tensors.tensor_id, tensors.storage))
    fixed = set(tensors.loc[tensors.kind.isin(FIXED_KINDS), "storage"])
    size = {sid: storage_weight(allocation, int(n)) for sid, n in zip(tensors.storage, tensors.storage_bytes)}
    return storage_of, fixed, size


def _no_recompute_across_updates(ops: dict[str, dict[str, Any]], reads: dict[str, set[int]],
                                 updated: dict[int, str]) -> None:
    """No op may read a parameter after the parameter's update (it would read the new value); the problem cannot
    say "not after", so where a recompute could do that, the op is not recomputed. Ops run first in stage order.

    An op is tainted where it reads an updated parameter, or a recomputable input of it is tainted. A backward op
    that is tainted is not recomputed (a gradient's matmul with the weight, whose output the gradients below it read
    after the update; no plan made so far recomputed a backward op). A forward op reading an updated parameter is
    not recomputed where its output may be read after the update: by an op after it, or, through forward ops that
    may be recomputed, as late as they may be read (the embedding, read by the first norm's weight gradient after
    the embedding's own update)."""
    if not updated:
        return
    order = list(ops)
    position = {op_id: i for i, op_id in enumerate(order)}
    update_at = {op_id: min(position[updated[sid]] for sid in sids & updated.keys())  # the earliest it reads across
                 for op_id, sids in reads.items() if op_id in ops and sids & updated.keys()}
    tainted: set[str] = set()
    for op_id, op in ops.items():
        if op_id in update_at or any(src in tainted and ops[src]["recompute"] for src in op["inputs"]):
            tainted.add(op_id)
            if op["phase"] == "backward":
                op["recompute"] = False
    readers: dict[str, list[str]] = {}
    for op_id, op in ops.items():
        for src in op["inputs"]:
            readers.setdefault(src, []).append(op_id)
    needed_until: dict[str, int] = {}  # the last position at which the op's output may be read
    for op_id in reversed(order):  # readers come later: their flags are final
        needed_until[op_id] = max((max(position[r], needed_until[r] if ops[r]["recompute"] else -1)
                                   for r in readers.get(op_id, ())), default=-1)
        if op_id in update_at and needed_until[op_id] > update_at[op_id]:
            ops[op_id]["recompute"] = False


def stage_problem(
    nodes: pd.DataFrame,
    tensors: pd.DataFrame,
    stage_nodes: list[str],
    *,
    bandwidth: float,
    swap: bool = True,
    allocation: str | None = None,
) -> dict[str, Any]:
    """Problem dict for the ops of ``stage_nodes`` (fx node names, in graph order) of a profiled graph.

    ``nodes`` must carry ``time_s`` (from the profile). The problem's ``budget_bytes`` is 0: the caller sets it.
    ``swap=False``: no op may be swapped (where the host is the same memory, as on a CPU, a swap frees none).
    ``allocation``: a device type whose allocator's sizes weigh each storage (``memory_model.storage_weight``,
    recorded in the problem), else its data bytes.
    """
    storage_of, fixed, size = _storage_tables(tensors, allocation)
    batch = set(tensors.loc[tensors.kind == "input", "storage"])
    in_stage = set(stage_nodes)
    rows = nodes.set_index("name")
    producer: dict[int, str] = {}  # storage -> fx node that allocates it
    for t in tensors.itertuples():
        if t.storage not in fixed and t.storage not in producer:
            producer[t.storage] = t.node
    ops: dict[str, dict[str, Any]] = {}  # problem ops, in stage order
    boundary: dict[str, dict[str, Any]] = {}
    storage_op: dict[int, str] = {}
    fixed_used: set[int] = set()
    reads: dict[str, set[int]] = {}  # op -> fixed storages (parameters) it reads
    updated: dict[int, str] = {}  # parameter -> the optimizer_step op of the stage that updates it

    phase_of = dict(zip(nodes.name, nodes.phase)) if "phase" in nodes else {}
    plain_sums: set[str] = set()  # ops computing an ``aten.add.Tensor``

    def new_op(op_id: str, storages: list[int], *, time: float = 0.0, inputs: list[str] | None = None,
               is_boundary: bool = False) -> dict[str, Any]:
        made_by = producer[storages[0]] if storages else None
        op = {"id": op_id, "time": time, "bytes": int(sum(size[x] for x in storages)), "inputs": inputs or [],
              "recompute": not is_boundary, "swap": swap, "nodes": [], "storages": storages,
              "phase": str(phase_of.get(made_by, "forward"))}
        if is_boundary:
            op["boundary"] = True
        (boundary if is_boundary else ops)[op_id] = op
        for sid in storages:
            storage_op[sid] = op_id
        return op

    def source(sid: int) -> str:
        """Problem op holding storage ``sid``; a storage made outside the stage becomes a boundary input."""
        if sid not in storage_op:
            new_op(f"in:{producer[sid]}:{sid}", [sid], is_boundary=True)
        return storage_op[sid]

    for name in stage_nodes:
        row = rows.loc[name]
        out_storages = list(dict.fromkeys(storage_of[t] for t in row.outputs if storage_of[t] not in fixed))
        own = [x for x in out_storages if producer[x] == name]
        op_name = str(row.op)
        mutates = is_inplace(op_name)
        if own or not out_storages or mutates:
            whole = _fused_forward(op_name)  # its saved tensors with it: remade by each of its computes
            op = new_op(name, own if whole else own[:1])
            # A further output is taken from the kernel's run: it reads the first output and the kernel's
            # inputs (all are held while the kernel runs) and cannot be recomputed alone: keep or swap it.
            extras = [] if whole else [new_op(f"{name}#{i}", [sid], inputs=[name])
                                       for i, sid in enumerate(own[1:], start=1)]
            for extra in extras:
                extra.update(recompute=False, of=name)
            # the kernel makes all its outputs at once: while it runs, the further ones are held too
            op["workspace"] = int(sum(e["bytes"] for e in extras))
        else:  # a view: folded into the op holding its base storage
            extras = []
            base = source(out_storages[0])
            op = ops.get(base) or boundary[base]
        op["nodes"].append(name)
        if op_name == PLAIN_SUM:
            plain_sums.add(op["id"])
        op["time"] += float(row.time_s)
        if getattr(row, "workspace_bytes", 0):  # temporaries a node allocates and frees within (measured)
            op["workspace"] = op.get("workspace", 0) + int(row.workspace_bytes)
        if op_name.startswith(ONCE_PER_STEP) or (op_name.startswith(FUSED_OPS) and FUSED_RANDOM in op_name):
            op["recompute"] = False
        for tid in row.inputs:
            sid = storage_of[tid]
            if sid in fixed:
                fixed_used.add(sid)
                if op_name.startswith(OPTIMIZER_STEP):
                    updated[sid] = op["id"]
                else:
                    reads.setdefault(op["id"], set()).add(sid)
                continue
            src = source(sid)
            if mutates and src != op["id"]:
                # its value is changed in place: a recompute would rebuild, and a host copy taken before the
                # change would bring back, the old value
                (ops.get(src) or boundary[src]).update(recompute=False, swap=False)
            if src != op["id"] and src not in op["inputs"]:
                op["inputs"].append(src)
        for extra in extras:
            extra["inputs"] += [x for x in op["inputs"] if x not in extra["inputs"]]
    _no_recompute_across_updates(ops, reads, updated)
    consumers_outside = {
        storage_of[tid]
        for row in nodes.itertuples()
        if row.name not in in_stage
        for tid in row.inputs
    }
    outputs = set(tensors.loc[tensors.is_graph_output, "storage"])
    keep = [op_id for op_id, op in ops.items() if any(x in consumers_outside or x in outputs for x in op["storages"])]
    partials = _added_into_outputs(nodes, storage_of, outputs)
    # gradients: storages made in backward, or holding a gradient a forward kernel makes (the chunked loss head's)
    grads = set(tensors.loc[tensors.kind == "gradient", "storage"])
    for op_id in keep:
        sids = set(ops[op_id]["storages"])
        if (outputs | partials) & sids:  # a forward graph output is the loss; the others are gradients
            backward = ops[op_id]["phase"] == "backward" or bool(grads & sids)
            ops[op_id]["gradient" if backward else "loss"] = True
    keep = merge_further_outputs(ops, keep)
    # A received storage is placed just before its first reader: a stage receives a gradient from the
    # next stage only when its backward needs it, not at its start (which would deadlock the pipeline).
    ordered: list[dict[str, Any]] = []
    for op in ops.values():
        ordered += [boundary.pop(src) for src in op["inputs"] if src in boundary]
        ordered.append(op)
    ordered += list(boundary.values())  # received but only viewed, never read by a compute op
    tied = {op["id"] for op in ordered if op.get("boundary") and partials.intersection(op["storages"])}
    for op in ordered:
        if op["id"] in tied:
            op["tied_partial"] = True
        elif op["id"] in plain_sums and tied.intersection(op["inputs"]):
            op["plain_sum"] = True  # with the partial read as zeros, its result is its other term
    return {
        "ops": ordered,
        "fixed_bytes": int(sum(size[s] for s in fixed_used)),
        "input_bytes": int(sum(size[s] for s in batch)),  # the batch's inputs, read here or not
        "budget_bytes": 0,
        "bandwidth": float(bandwidth),
        "keep": keep,
        **({"allocation": allocation} if allocation else {}),
    }


def merge_further_outputs(ops: dict[str, dict[str, Any]], keep: list[str]) -> list[str]:
    """Make the further outputs of one kernel that no schedule can tell apart one op; returns ``keep`` without
    the ops merged away.

    Two further outputs of a kernel (``of``) are never recomputed; where neither may be swapped, read by the
    same ops, kept alike and marked alike (gradient, loss, phase), every schedule makes them at the kernel's
    first compute and may free them only after the same last reader: as one op they hold the same bytes at
    every moment. A fused op's saved tensors (all read by its backward op alone) and a backward kernel's
    parameter gradients (all kept to the end) so become one op each. Where a swap is allowed they stay apart
    (one may be worth swapping and the other not).
    """
    readers: dict[str, list[str]] = {}
    for op_id, op in ops.items():
        for src in op["inputs"]:
            readers.setdefault(src, []).append(op_id)
    kept = set(keep)
    first: dict[tuple[Any, ...], str] = {}
    merged: dict[str, str] = {}  # merged away -> the op it is now part of
    for op_id, op in ops.items():
        if op.get("of") is None or op["swap"]:
            continue
        key = (op["of"], tuple(readers.get(op_id, ())), op_id in kept, op.get("gradient", False),
               op.get("loss", False), op["phase"])
        into = first.setdefault(key, op_id)
        if into != op_id:
            target = ops[into]
            for field in ("storages", "nodes"):  # its views (getitems of the kernel's tuple) go with it
                target[field] += op[field]
            for field in ("bytes", "time", "workspace"):
                if field in op:
                    target[field] = target.get(field, 0) + op[field]
            merged[op_id] = into
    for op_id in merged:
        del ops[op_id]
    for op in ops.values():
        op["inputs"] = [x for x in op["inputs"] if x not in merged]
    return [x for x in keep if x not in merged]


def _added_into_outputs(nodes: pd.DataFrame, storage_of: dict[str, int], outputs: set[int]) -> set[int]:
    """Storages a gradient sum (``aten_ops.GRADIENT_SUMS``, its whole terms) adds into a graph output: where one is
    made by another stage than the sum's, a tied weight's partial gradient, which a pipeline sums across
    micro-batches where it is made and does not send per micro-batch (``trainplan.pipeline.tied``)."""
    out: set[int] = set()
    for row in nodes.itertuples():
        terms = GRADIENT_SUMS.get(str(row.op), 0)
        if terms and any(storage_of[t] in outputs for t in row.outputs):
            out.update(storage_of[t] for t in row.inputs[:terms])
    return out


def no_recompute_peak(problem: dict[str, Any]) -> int:
    """Peak bytes (fixed included) of running the problem's ops in order, each freed after its last use."""
    return int(no_recompute(problem_from_dict({**problem, "budget_bytes": 2**62})).peak_bytes)


def budget_for(problem: dict[str, Any], budget: Budget | str | int | float, peak: int | None = None) -> int:
    """The budget in bytes (:func:`trainplan.budget.parse_budget`): bytes as given, or for a fraction, the
    fixed bytes + that fraction of the no-recompute peak above them (``peak``; default the stage's own)."""
    parsed = parse_budget(budget)
    if parsed.bytes is not None:
        return parsed.bytes
    peak = no_recompute_peak(problem) if peak is None else peak
    return int(problem["fixed_bytes"] + parsed.fraction * (peak - problem["fixed_bytes"]))
