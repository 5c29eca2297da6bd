"""Gradients added into their running sums where they are made, as autograd accumulates ``.grad``.

A pipeline stage running m > 1 micro-batches holds its gradient sums all along (``pipeline_hold``: a term of
its rank's hold). If each new gradient were returned with the others at the end of the stage's backward, the
rank would hold the sums and a second full set of gradients at once. Instead the run adds each gradient into
its sum (``.grad``, or the tied partial's running sum) as soon as the op making it has run, and drops it.

In the stage problem such an op (marked ``gradient``, read by no op of the stage) then holds no bytes after it
runs: :func:`accumulate_where_made` moves its bytes into the op's ``workspace`` (held while it runs; a kernel's
further output is already in its kernel's workspace) and records them as ``accumulated_bytes``; it runs once
(a second run would add the gradient twice).

A tied weight's partial gradient that another stage makes is added once per step (``trainplan.pipeline.tied``):
per micro-batch the receiving stage reads zeros in its place, one broadcast element; :func:`tied_partials_as_zeros`
makes that boundary input hold no bytes (recorded as ``stand_in_bytes``); the gradient adding them is its other
input, held as it is (``alias``), where it is a plain add (``plain_sum``); a ``trainplan::embedding_grad_add`` into
zeros makes the embedding's gradient table, held while it runs as every accumulated gradient.

Run alone, one micro-batch, the gradients are held to the end of the step and the partial is received:
:func:`held_alone` gives that problem back, its budget raised by the gradients' bytes (which the rank's budget
counts as the sums).
"""

from __future__ import annotations

import copy
from typing import Any


def accumulated_ops(problem: dict[str, Any]) -> list[dict[str, Any]]:
    """Ops marked ``gradient`` that no op of the stage reads (a kernel's further output taken from it does not read
    it): those a pipeline adds into their sums where made."""
    read = {x for op in problem["ops"] for x in op.get("inputs", ()) if x != op.get("of")}
    return [op for op in problem["ops"] if op.get("gradient") and not op.get("boundary") and op["id"] not in read]


def accumulate_where_made(problem: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``problem`` in which each of :func:`accumulated_ops` holds its bytes only while it runs; a plain
    add of a tied partial received as zeros (:func:`tied_partials_as_zeros`) is its other input (``alias``: the
    run holds that value as its result) and holds none."""
    out = copy.deepcopy(problem)
    zeros = {op["id"] for op in out["ops"] if op.get("tied_partial") and "stand_in_bytes" in op}
    for op in accumulated_ops(out):
        op["accumulated_bytes"] = int(op["bytes"])
        if op.get("plain_sum") and zeros.intersection(op.get("inputs", ())):
            op["alias"] = True
        elif op.get("of") is None:  # a further output's bytes are in its kernel's workspace already
            op["workspace"] = int(op.get("workspace", 0)) + int(op["bytes"])
        op.update(bytes=0, recompute=False, swap=False)
    return out


def tied_partials_as_zeros(problem: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``problem`` in which each boundary input marked ``tied_partial`` holds no bytes."""
    out = copy.deepcopy(problem)
    for op in out["ops"]:
        if op.get("tied_partial"):
            op["stand_in_bytes"] = int(op["bytes"])
            op["bytes"] = 0
    return out


def accumulates(problem: dict[str, Any]) -> bool:
    """Whether the problem's gradients are added into their sums where made (:func:`accumulate_where_made`)."""
    return any("accumulated_bytes" in op for op in problem["ops"])


def accumulated_storages(problem: dict[str, Any]) -> frozenset[int]:
    """Plan storages whose gradients are added into their sums where made."""
    return frozenset(int(s) for op in problem["ops"] if "accumulated_bytes" in op for s in op["storages"])


def held_alone(problem: dict[str, Any]) -> dict[str, Any]:
    """The problem as its stage runs alone, one micro-batch, every gradient held to the end of the step: the
    accumulated ops' bytes back and the tied partials received (their bytes back), the budget raised by both (the
    sums the rank's budget counts; a partial the pipeline adds once per step, outside the stage's events), so that
    the schedule fits the raised budget whenever it fits the problem's."""
    if not any("accumulated_bytes" in op or "stand_in_bytes" in op for op in problem["ops"]):
        return problem
    out = copy.deepcopy(problem)
    total = 0
    for op in out["ops"]:
        if "stand_in_bytes" in op:
            op["bytes"] = op.pop("stand_in_bytes")
            total += op["bytes"]
        nbytes = op.pop("accumulated_bytes", None)
        if nbytes is None:
            continue
        if op.get("of") is None and not op.pop("alias", False):
            op["workspace"] = int(op["workspace"]) - nbytes
        op["bytes"] = nbytes
        total += nbytes
    out["budget_bytes"] = int(out["budget_bytes"]) + total
    return out
