"""Problem dataclasses: load, validate and save a scheduling problem (one pipeline stage)."""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from trainplan.errors import ArtifactError
from trainplan.io import read_json, write_json


class ProblemError(ValueError):
    """A problem file or dict is malformed; the message names the op and key."""


@dataclass(frozen=True)
class Op:
    """One op: its run time (s), output bytes, inputs (earlier op ids), workspace and flags. ``of`` names the
    kernel this op is a further output of: it is made by that kernel's first compute and taken at once (see
    :func:`trainplan.schedule.replay.replay`)."""

    id: str
    time: float
    bytes: int
    inputs: tuple[str, ...] = ()
    workspace: int = 0
    recompute: bool = True
    swap: bool = True
    of: str | None = None


@dataclass(frozen=True)
class Problem:
    """Ops in topological (program) order, the device budget and the host-link bandwidth."""

    ops: tuple[Op, ...]
    budget_bytes: int
    bandwidth: float
    fixed_bytes: int = 0
    keep: tuple[str, ...] = ()
    index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", {op.id: i for i, op in enumerate(self.ops)})

    @property
    def n(self) -> int:
        return len(self.ops)

    @cached_property
    def inputs(self) -> list[tuple[int, ...]]:
        """Unique input indices of each op (an op reading a tensor twice holds it once)."""
        return [tuple(sorted({self.index[x] for x in op.inputs})) for op in self.ops]

    @cached_property
    def users(self) -> list[list[int]]:
        """Sorted consumer indices of each op."""
        users: list[list[int]] = [[] for _ in self.ops]
        for v, ins in enumerate(self.inputs):
            for u in ins:
                users[u].append(v)
        return users

    @cached_property
    def outputs_of(self) -> dict[int, list[int]]:
        """Kernel index -> indices of its further outputs (ops with ``of``), in order."""
        out: dict[int, list[int]] = {}
        for v, op in enumerate(self.ops):
            if op.of is not None:
                out.setdefault(self.index[op.of], []).append(v)
        return out

    @cached_property
    def keep_idx(self) -> frozenset[int]:
        return frozenset(self.index[k] for k in self.keep)

    def next_use(self, u: int, t: int) -> int | None:
        """First program step >= t that reads u; ``n`` for a keep op with no later reader; else None."""
        uses = self.users[u]
        k = bisect_left(uses, t)
        if k < len(uses):
            return uses[k]
        return self.n if u in self.keep_idx else None

    def transfer_time(self, u: int) -> float:
        """Seconds to move u's output over the host link once (one direction)."""
        return self.ops[u].bytes / self.bandwidth

    @cached_property
    def working_sets(self) -> list[int]:
        """Bytes each op needs on the device while it runs: its inputs, output and workspace."""
        return [sum(self.ops[u].bytes for u in ins) + op.bytes + op.workspace
                for op, ins in zip(self.ops, self.inputs)]

    @cached_property
    def floor_bytes(self) -> int:
        """Memory floor: fixed + max over ops of (inputs + output + workspace), and >= the keep set."""
        keep = sum(self.ops[u].bytes for u in self.keep_idx)
        return self.fixed_bytes + max(max(self.working_sets), keep)

    @cached_property
    def compute_time(self) -> float:
        """Sum of op times, each op once: the step time without recompute or swap (a lower bound)."""
        return math.fsum(op.time for op in self.ops)

    def with_budget(self, budget_bytes: int) -> Problem:
        return Problem(self.ops, int(budget_bytes), self.bandwidth, self.fixed_bytes, self.keep)

    def in_order(self, ids: list[str]) -> Problem:
        """The same problem with its ops in the order ``ids`` (a topological order of every op id): the program
        order the methods follow for first computes."""
        if sorted(ids) != sorted(self.index):
            raise ProblemError("a new op order must name every op once")
        pos = {oid: i for i, oid in enumerate(ids)}
        for oid in ids:
            late = [x for x in self.ops[self.index[oid]].inputs if pos[x] > pos[oid]]
            if late:
                raise ProblemError(f"op '{oid}' would come before its input '{late[0]}'")
        return Problem(tuple(self.ops[self.index[oid]] for oid in ids), self.budget_bytes, self.bandwidth,
                       self.fixed_bytes, self.keep)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ops": [
                {"id": o.id, "time": o.time, "bytes": o.bytes, "inputs": list(o.inputs),
                 "workspace": o.workspace, "recompute": o.recompute, "swap": o.swap}
                | ({} if o.of is None else {"of": o.of})
                for o in self.ops
            ],
            "fixed_bytes": self.fixed_bytes,
            "budget_bytes": self.budget_bytes,
            "bandwidth": self.bandwidth,
            "keep": list(self.keep),
        }


def _num(value: Any, where: str, *, integer: bool, positive: bool = False) -> Any:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        kind = "an integer" if integer else "a number"
        raise ProblemError(f"{where} must be {kind}, got {value!r}")
    if not math.isfinite(value) or value < 0 or (positive and value <= 0):
        raise ProblemError(f"{where} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return value


def _flag(raw: dict[str, Any], key: str, where: str) -> bool:
    value = raw.get(key, True)
    if not isinstance(value, bool):
        raise ProblemError(f"{where} key '{key}' must be true or false, got {value!r}")
    return value


def _kernel_of(raw: dict[str, Any], where: str, earlier: list[Op]) -> str | None:
    """The ``of`` key: the kernel op right before (or before its other further outputs), read by this op,
    which may not be recomputed."""
    kernel = raw.get("of")
    if kernel is None:
        return None
    previous = None
    for o in reversed(earlier):  # the last op that is not a further output, passing only kernel's others
        if o.of is None or o.of != kernel:
            previous = o if o.of is None else None
            break
    if not isinstance(kernel, str) or previous is None or previous.id != kernel:
        raise ProblemError(f"{where} key 'of' must name the op right before it (or before that op's other "
                           f"further outputs), got {kernel!r}")
    if kernel not in raw.get("inputs", []):
        raise ProblemError(f"{where} key 'of': a further output of '{kernel}' must list it in 'inputs'")
    if raw.get("recompute", True):
        raise ProblemError(f"{where} key 'of': a further output is never recomputed alone: set recompute false")
    return kernel


def problem_from_dict(data: Any) -> Problem:
    """Build and validate a Problem; unknown extra keys are ignored. Raises ProblemError."""
    if not isinstance(data, dict):
        raise ProblemError("problem must be a JSON object")
    for key in ("ops", "budget_bytes", "bandwidth"):
        if key not in data:
            raise ProblemError(f"missing top-level key '{key}'")
    if not isinstance(data["ops"], list) or not data["ops"]:
        raise ProblemError("'ops' must be a non-empty list")
    ops: list[Op] = []
    seen: set[str] = set()
    all_ids = {o.get("id") for o in data["ops"] if isinstance(o, dict)}
    for pos, raw in enumerate(data["ops"]):
        if not isinstance(raw, dict):
            raise ProblemError(f"ops[{pos}] must be an object")
        if "id" not in raw:
            raise ProblemError(f"ops[{pos}] missing key 'id'")
        oid = raw["id"]
        if not isinstance(oid, str) or not oid:
            raise ProblemError(f"ops[{pos}] key 'id' must be a non-empty string, got {oid!r}")
        where = f"op '{oid}'"
        if oid in seen:
            raise ProblemError(f"{where}: duplicate id")
        for key in ("time", "bytes"):
            if key not in raw:
                raise ProblemError(f"{where} missing key '{key}'")
        inputs = raw.get("inputs", [])
        if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
            raise ProblemError(f"{where} key 'inputs' must be a list of op ids")
        for x in inputs:
            if x not in seen:
                why = "is defined at or after it (ops must be in topological order)" if x in all_ids else "is unknown"
                raise ProblemError(f"{where} input '{x}' {why}")
        ops.append(Op(
            id=oid,
            time=float(_num(raw["time"], f"{where} key 'time'", integer=False)),
            bytes=_num(raw["bytes"], f"{where} key 'bytes'", integer=True),
            inputs=tuple(inputs),
            workspace=_num(raw.get("workspace", 0), f"{where} key 'workspace'", integer=True),
            recompute=_flag(raw, "recompute", where),
            swap=_flag(raw, "swap", where),
            of=_kernel_of(raw, where, ops),
        ))
        seen.add(oid)
    keep = data.get("keep", [])
    if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
        raise ProblemError("'keep' must be a list of op ids")
    for k in keep:
        if k not in seen:
            raise ProblemError(f"'keep' names unknown op '{k}'")
    return Problem(
        ops=tuple(ops),
        budget_bytes=_num(data["budget_bytes"], "'budget_bytes'", integer=True),
        bandwidth=float(_num(data["bandwidth"], "'bandwidth'", integer=False, positive=True)),
        fixed_bytes=_num(data.get("fixed_bytes", 0), "'fixed_bytes'", integer=True),
        keep=tuple(dict.fromkeys(keep)),
    )


def load_problem(path: str | Path, stage: int | None = None) -> Problem:
    """Read and validate a problem JSON file, or with ``stage`` the problem of that stage of a schedules.json
    (the schedule rule's output); errors name the file (ProblemError)."""
    try:
        data = read_json(path)
    except ArtifactError as exc:
        raise ProblemError(str(exc)) from exc
    if stage is not None:
        stages = data.get("stages") if isinstance(data, dict) else None
        if not isinstance(stages, list) or not 0 <= stage < len(stages) or not isinstance(stages[stage], dict):
            raise ProblemError(f"{path}: no stage {stage} (a schedules.json has a 'stages' list)")
        data = stages[stage].get("problem")
    try:
        return problem_from_dict(data)
    except ProblemError as exc:
        raise ProblemError(f"{path}: {exc}") from exc


def save_problem(path: str | Path, problem: Problem) -> None:
    write_json(path, problem.to_dict())
