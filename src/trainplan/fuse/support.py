"""Support tables, the seed's two levels: which ops the device runs at all, and the library's per-op rules.

A table (YAML, see docs/fuse.md) has ``name``, ``ops`` (aten overload names or fnmatch patterns the device
executes; everything else falls back to the host) and ``rules``: each rule names ``ops`` (patterns, each
matching something in ``ops``) and conditions checked on a node's exported tensors:

- ``max_dim: N``      every dimension of every input and output tensor is at most N;
- ``max_rank: N``     every tensor has at most N dimensions;
- ``dtypes: [...]``   every tensor's dtype is one of these;
- ``deny_dtypes: [...]`` no tensor has one of these dtypes;
- ``groups: N``       convolution groups (input channels / the weight's dim 1, from the shapes) equal N.

``inductor`` is built at run time from the installed torch: ops with an Inductor lowering or decomposition,
minus the ops Inductor falls back to eager for.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainplan.fuse.errors import FuseError
from trainplan.fuse.graph import OpGraph, TensorInfo
from trainplan.errors import ArtifactError
from trainplan.io import read_yaml

CONDITIONS = ("max_dim", "max_rank", "dtypes", "deny_dtypes", "groups")
GETITEM = "getitem"


@dataclass(frozen=True)
class Rule:
    """One library rule: ops it applies to and the conditions a node of those ops must meet."""

    ops: tuple[str, ...]
    conditions: dict[str, Any]
    why: str = ""

    def applies(self, op: str) -> bool:
        return any(fnmatch.fnmatchcase(op, p) for p in self.ops)

    def violation(self, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo]) -> str | None:
        """The first condition the tensors break, as text, or None when they meet all."""
        tensors = [*inputs, *outputs]
        c = self.conditions
        if "max_dim" in c:
            big = [d for t in tensors for d in t.shape if d > c["max_dim"]]
            if big:
                return f"dim {max(big)} > max_dim {c['max_dim']}"
        if "max_rank" in c:
            rank = max((len(t.shape) for t in tensors), default=0)
            if rank > c["max_rank"]:
                return f"rank {rank} > max_rank {c['max_rank']}"
        if "dtypes" in c:
            bad = sorted({t.dtype for t in tensors} - set(c["dtypes"]))
            if bad:
                return f"dtype {bad[0]} not in {list(c['dtypes'])}"
        if "deny_dtypes" in c:
            bad = sorted({t.dtype for t in tensors} & set(c["deny_dtypes"]))
            if bad:
                return f"dtype {bad[0]} denied"
        if "groups" in c:
            groups = conv_groups(inputs)
            if groups is not None and groups != c["groups"]:
                return f"groups {groups} != {c['groups']}"
        return None


def conv_groups(inputs: Sequence[TensorInfo]) -> int | None:
    """Convolution groups from the shapes: channels of the activation / dim 1 of the weight (None if unknown).

    The activation and the weight are the last two inputs of rank >= 3: forward convolution reads
    (input, weight, bias), its backward (grad_output, input, weight).
    """
    ranked = [t for t in inputs if len(t.shape) >= 3]
    if len(ranked) < 2 or ranked[-1].shape[1] == 0:
        return None
    act, weight = ranked[-2], ranked[-1]
    return act.shape[1] // weight.shape[1]


@dataclass(frozen=True)
class SupportTable:
    """Device support (``ops`` patterns) and library rules of one target."""

    name: str
    ops: tuple[str, ...]
    rules: tuple[Rule, ...] = ()
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_exact", frozenset(p for p in self.ops if not _is_pattern(p)))
        object.__setattr__(self, "_patterns", tuple(p for p in self.ops if _is_pattern(p)))

    def runs(self, op: str) -> bool:
        """Whether the device executes ``op`` at all."""
        return op in self._exact or any(fnmatch.fnmatchcase(op, p) for p in self._patterns)  # type: ignore[attr-defined]

    def violation(self, op: str, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo]) -> str | None:
        """The first library rule ``op`` on these tensors breaks ('rule k (why): condition'), or None."""
        for k, rule in enumerate(self.rules):
            if rule.applies(op):
                broken = rule.violation(inputs, outputs)
                if broken:
                    return f"rule {k}{f' ({rule.why})' if rule.why else ''}: {broken}"
        return None


def _is_pattern(p: str) -> bool:
    return any(ch in p for ch in "*?[")


def _known_ops() -> set[str]:
    """Every op overload name torch's dispatcher knows, as ``aten.name.overload``."""
    import torch

    out = set()
    for qual in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qual.partition("::")
        name, _, overload = rest.partition(".")
        out.add(f"{ns}.{name}.{overload or 'default'}")
    return out


def table_from_dict(doc: Any, where: str) -> SupportTable:
    """Validate a table document; errors name ``where`` (the file) and the op or key."""
    if not isinstance(doc, dict) or not isinstance(doc.get("ops"), list) or not doc["ops"]:
        raise FuseError(f"support table {where}: needs a non-empty 'ops' list")
    ops = tuple(str(o) for o in doc["ops"])
    known = _known_ops()
    for op in ops:
        if not _is_pattern(op) and op != GETITEM and op not in known:
            raise FuseError(f"support table {where}: unknown op '{op}' (not an op overload of the installed torch)")
    rules = []
    for k, raw in enumerate(doc.get("rules") or []):
        if not isinstance(raw, dict) or not isinstance(raw.get("ops"), list) or not raw["ops"]:
            raise FuseError(f"support table {where}: rule {k} needs a non-empty 'ops' list")
        extra = set(raw) - {"ops", "why", *CONDITIONS}
        if extra:
            raise FuseError(f"support table {where}: rule {k}: unknown key '{sorted(extra)[0]}' (conditions: {list(CONDITIONS)})")
        for pattern in raw["ops"]:
            pattern = str(pattern)
            if not any(fnmatch.fnmatchcase(o, pattern) or fnmatch.fnmatchcase(pattern, o) for o in ops):
                raise FuseError(f"support table {where}: rule {k}: unknown op '{pattern}' (matches no op the table supports)")
        conditions = {key: raw[key] for key in CONDITIONS if key in raw}
        rules.append(Rule(tuple(str(p) for p in raw["ops"]), conditions, str(raw.get("why", ""))))
    return SupportTable(str(doc.get("name", Path(where).stem)), ops, tuple(rules), {"file": where})


def load_table(path: str | Path) -> SupportTable:
    """Read a YAML support table; a missing/invalid file raises FuseError naming it."""
    try:
        doc = read_yaml(path, "support table")
    except ArtifactError as exc:
        raise FuseError(str(exc)) from None
    return table_from_dict(doc, str(path))


def inductor_table() -> SupportTable:
    """The installed torch's Inductor: ops with a lowering or a decomposition, minus its fallbacks."""
    import torch
    import torch._inductor.compile_fx  # noqa: F401  (registers every lowering, the kernel modules' too)
    from torch._inductor import lowering
    from torch._inductor.decomposition import select_decomp_table

    def names(ops: Any) -> set[str]:
        return {str(op) for op in ops if isinstance(op, torch._ops.OpOverload)}

    lowered, decomposed, fallback = names(lowering.lowerings), names(select_decomp_table()), names(lowering.fallbacks)
    ops = sorted((lowered | decomposed) - fallback)
    return SupportTable("inductor", (*ops, GETITEM), (), {
        "torch": torch.__version__, "lowerings": len(lowered), "decompositions": len(decomposed),
        "fallbacks": len(fallback), "supported": len(ops),
    })


#: the matrix products (op names ``aten.<name>.<overload>``): Inductor calls the same BLAS for them as eager does
MATMULS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear")


def without(table: SupportTable, names: tuple[str, ...], suffix: str) -> SupportTable:
    """``table`` less the ops ``aten.<name>.*`` of ``names``, named ``<table>-<suffix>``."""
    prefixes = tuple(f"aten.{m}." for m in names)
    ops = tuple(op for op in table.ops if not op.startswith(prefixes))
    return SupportTable(f"{table.name}-{suffix}", ops, table.rules,
                        {**table.source, "without": [*table.source.get("without", ()), *names]})


def without_matmuls(table: SupportTable) -> SupportTable:
    """``table`` less the matrix products (MATMULS), so groups are pointwise and reduction work around them: in
    GPT-2 small's fused step (2 x 128, CPU) the matmuls inside Inductor's code took 0.10 s more than eager's
    (aten::mm 1.06 against 0.96 s) while its fused kernels saved 0.13 s of pointwise work."""
    return without(table, MATMULS, "no-matmul")


def builtin_table(name: str) -> SupportTable | None:
    """A built-in table by name: ``inductor``, or ``inductor-no-matmul`` (:func:`without_matmuls`); None otherwise."""
    if name == "inductor":
        return inductor_table()
    if name == "inductor-no-matmul":
        return without_matmuls(inductor_table())
    return None


def resolve_table(spec: str | dict[str, Any]) -> SupportTable:
    """A table from a config entry (``{builtin: inductor | inductor-no-matmul}`` or ``{table: path}``) or a CLI
    argument (a built-in's name or a path)."""
    if isinstance(spec, dict):
        table = builtin_table(str(spec.get("builtin")))
        if table is not None:
            return table
        if "table" in spec:
            return load_table(spec["table"])
        raise FuseError(f"target spec {spec!r}: needs 'builtin: inductor', 'builtin: inductor-no-matmul' or "
                        "'table: PATH'")
    return builtin_table(spec) or load_table(spec)


def support_masks(graph: OpGraph, table: SupportTable, pinned: Sequence[bool | None] | None = None
                  ) -> tuple[list[bool], dict[int, str]]:
    """Device support per node and the library-rule violations of the supported ones.

    ``getitem`` (selecting one output of a multi-output op) runs wherever its producer runs. A node's own
    ``supported: false`` (``pinned``) keeps it on the host; ``true`` marks it supported without the table.
    """
    supported = [False] * graph.n
    for u in graph.order:
        if pinned is not None and pinned[u] is not None:
            supported[u] = bool(pinned[u])
        elif graph.ops[u] == GETITEM:
            supported[u] = bool(graph.preds[u]) and all(supported[p] for p in graph.preds[u])
        else:
            supported[u] = table.runs(graph.ops[u])
    broken = {}
    for u in range(graph.n):
        if supported[u]:
            why = table.violation(graph.ops[u], graph.inputs[u], graph.outputs[u])
            if why:
                broken[u] = why
    return supported, broken
