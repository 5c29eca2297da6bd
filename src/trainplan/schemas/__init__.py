"""JSON Schemas of the artifacts rules read (``<name>.json`` beside this file), and the checks across
fields a schema cannot state (a list's length against a count written beside it).

:func:`check` raises :class:`trainplan.errors.ArtifactError` naming the file and the first bad key, so a
truncated or hand-edited artifact stops the rule that reads it instead of flowing into later results.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

import jsonschema

from trainplan.errors import ArtifactError


class SchemaError(ArtifactError):
    """An artifact does not match its schema or breaks an invariant; the message names file and key."""


def names() -> list[str]:
    """Names of the documented schemas (file stems)."""
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".json"))


@cache
def _validator(name: str) -> jsonschema.protocols.Validator:
    try:
        schema = json.loads(resources.files(__name__).joinpath(f"{name}.json").read_text())
    except FileNotFoundError as exc:
        raise KeyError(f"no artifact schema '{name}' (known: {names()})") from exc
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _where(path: Any) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "top level"


def _counted_lists(data: dict[str, Any]) -> list[str]:
    """Lists whose length differs from the count written beside them in ``counts``."""
    return [f"'{key}' has {len(data.get(key) or [])} entries, 'counts.{key}' says {n}"
            for key, n in data.get("counts", {}).items() if len(data.get(key) or []) != n]


def _stage_lists(data: dict[str, Any]) -> list[str]:
    """A plan or partition: one stage per pair of cuts, stages numbered in order, k stated right."""
    errors = []
    if "cuts" in data and len(data["stages"]) != len(data["cuts"]) - 1:
        errors.append(f"'stages' has {len(data['stages'])} entries, 'cuts' {data['cuts']} make {len(data['cuts']) - 1}")
    if "k" in data and data["k"] != len(data["stages"]):
        errors.append(f"'k' is {data['k']}, 'stages' has {len(data['stages'])} entries")
    for pos, stage in enumerate(data["stages"]):
        if "index" in stage and stage["index"] != pos:
            errors.append(f"stages[{pos}].index is {stage['index']}")
        if "n_nodes" in stage and stage["n_nodes"] != len(stage["nodes"]):
            errors.append(f"stages[{pos}] lists {len(stage['nodes'])} nodes, 'n_nodes' says {stage['n_nodes']}")
    return errors


def _event_counts(schedule: dict[str, Any]) -> list[str]:
    """A schedule: the recompute and swap counts written beside the events are what the events hold."""
    kinds = [kind for kind, _ in schedule["events"]]
    computed = [op for kind, op in schedule["events"] if kind == "compute"]
    actual = {"swap_ins": kinds.count("swap_in"), "swap_outs": kinds.count("swap_out"),
              "recomputes": len(computed) - len(set(computed))}
    return [f"'events' hold {n} {key}, '{key}' says {schedule[key]}" for key, n in actual.items()
            if key in schedule and schedule[key] != n]


def _plan(data: dict[str, Any]) -> list[str]:
    """A plan: stage lists as in a partition, and every stage's schedule consistent with its events."""
    return _stage_lists(data) + [f"stages[{pos}].schedule: {e}" for pos, stage in enumerate(data["stages"])
                                 for e in _event_counts(stage["schedule"])]


def _findings(data: dict[str, Any]) -> list[str]:
    """An overflow pass: as many findings as recorded, every root among them and on the next deny list."""
    errors = []
    if data["n_recorded"] != len(data["findings"]):
        errors.append(f"'findings' has {len(data['findings'])} entries, 'n_recorded' says {data['n_recorded']}")
    recorded = {f["node"] for f in data["findings"]}
    errors += [f"root '{r}' is not among the findings" for r in data["roots"] if r not in recorded]
    errors += [f"root '{r}' is missing from 'deny_nodes'" for r in data["roots"] if r not in data["deny_nodes"]]
    return errors


def _iterations(data: dict[str, Any]) -> list[str]:
    """A balance record: the chosen iteration is one of those listed."""
    n = len(data["iterations"])
    return [] if 0 <= data["chosen_iteration"] < n else [f"'chosen_iteration' {data['chosen_iteration']} of {n} iterations"]


def _validation(data: dict[str, Any]) -> list[str]:
    """A validation document: stages numbered in order, as many as the plan's k unless it failed before any
    stage ran."""
    errors = [f"stages[{pos}].index is {st['index']}" for pos, st in enumerate(data["stages"]) if st["index"] != pos]
    if data["stages"] and len(data["stages"]) != data["k"]:
        errors.append(f"'k' is {data['k']}, 'stages' has {len(data['stages'])} entries")
    return errors


INVARIANTS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "policy": _counted_lists,
    "partition": _stage_lists,
    "plan": _plan,
    "schedule": _event_counts,
    "findings": _findings,
    "iterations": _iterations,
    "validation": _validation,
}


def check(data: Any, name: str, source: str) -> Any:
    """``data`` if it matches schema ``name`` and its invariants; else SchemaError naming ``source``."""
    errors = sorted(_validator(name).iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise SchemaError(f"{source}: not a valid {name} artifact: at {_where(first.absolute_path)}: "
                          f"{first.message[:300]}{more}")
    broken = INVARIANTS.get(name, lambda _: [])(data)
    if broken:
        raise SchemaError(f"{source}: inconsistent {name} artifact (truncated or edited?): {'; '.join(broken)}")
    return data
