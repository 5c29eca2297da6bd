"""OPS.json (ops to plan) -> OpSpec list, and PLAN.json (plans and totals); errors name the op."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainplan.align.classes import OpSpec, primary_arg, resolve
from trainplan.align.plan import plan_op, totals
from trainplan.align.units import AlignError
from trainplan.io import read_json, write_json


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in value):
        raise AlignError(f"{where}: bad shape {value!r} (a list of positive integers)")
    return tuple(value)


def parse_op(entry: Any, index: int, default_dtype: str = "float16") -> OpSpec:
    """One OPS.json entry: ``{id, op, shape, dtype?, dim?, args?, inputs?, outputs?}``.

    ``shape`` is the op's primary tensor (the first tensor argument; ``mat1`` of addmm); ``inputs`` /
    ``outputs`` map schema argument names / ``out0``... to the shapes of its other half-precision tensors.
    """
    if not isinstance(entry, dict):
        raise AlignError(f"ops[{index}]: expected an object, got {type(entry).__name__}")
    op_id = str(entry.get("id", f"ops[{index}]"))
    where = f"op '{op_id}'"
    if "op" not in entry or not isinstance(entry["op"], str):
        raise AlignError(f"{where}: missing key 'op'")
    target = resolve(entry["op"], f"{where}: ")
    if "shape" not in entry:
        raise AlignError(f"{where}: missing key 'shape'")
    inputs = {primary_arg(target): _shape(entry["shape"], where)}
    for name, shape in (entry.get("inputs") or {}).items():
        inputs[str(name)] = _shape(shape, f"{where} input '{name}'")
    outputs = {str(k): _shape(v, f"{where} output '{k}'") for k, v in (entry.get("outputs") or {}).items()}
    args = dict(entry.get("args") or {})
    if "dim" in entry:
        args["dim"] = entry["dim"]
    dtype = entry.get("dtype", default_dtype)
    if not isinstance(dtype, str):
        raise AlignError(f"{where}: bad dtype {dtype!r}")
    return OpSpec(op_id, entry["op"], dtype, inputs, outputs, args)


def read_ops(path: str | Path) -> list[OpSpec]:
    """Every op of an OPS.json file; a malformed file or entry raises AlignError / ArtifactError."""
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("ops"), list):
        raise AlignError(f"{path}: expected an object with a list 'ops'")
    ops = [parse_op(e, i) for i, e in enumerate(data["ops"])]
    seen: set[str] = set()
    for spec in ops:
        if spec.id in seen:
            raise AlignError(f"{path}: op id '{spec.id}' appears twice")
        seen.add(spec.id)
    return ops


def plan_ops(ops: list[OpSpec], granularity: int, matmul_rule: str = "dma") -> dict[str, Any]:
    """PLAN.json content: granularity, matmul rule, per-op plans and their totals (every op planned before
    anything is written)."""
    plans = [plan_op(spec, granularity, matmul_rule) for spec in ops]
    return {"granularity_bytes": granularity, "matmul_rule": matmul_rule, "ops": plans, "totals": totals(plans)}


def write_plan(path: str | Path, plan: dict[str, Any]) -> None:
    """Write PLAN.json atomically."""
    write_json(path, plan)
