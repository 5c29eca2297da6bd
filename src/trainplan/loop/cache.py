"""Plans on disk, keyed by what they were made for: the traced graph, the batch, the device, the budget, the
loss function, the solver settings that change the result, the torch version and trainplan's own code (a
digest of the package's source: a plan made by other code is made again).

A record is ``{"key": {the fields hashed, with the record FORMAT}, "stages": [a plan stage (execute.plan_stage)]}``
at ``<cache dir>/<sha256 of key, 32 hex digits>.json``, written atomically.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from trainplan.errors import ArtifactError
from trainplan.io import read_json

log = logging.getLogger(__name__)

CACHE_ENV = "TRAINPLAN_PLAN_CACHE"  # overrides the default cache directory
FORMAT = 2  # of a record: a new one never reads an old one (2: a raised schedule says status "raised")


def cache_dir(given: str | os.PathLike[str] | None = None) -> Path:
    """Where plans are cached: ``given``, else ``$TRAINPLAN_PLAN_CACHE``, else ``~/.cache/trainplan/plans``."""
    if given is not None:
        return Path(given).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path("~/.cache/trainplan/plans").expanduser()


@functools.cache
def package_digest() -> str:
    """Short sha256 of every ``.py`` file of the installed trainplan package (paths and bytes), read once."""
    root = Path(__file__).resolve().parents[1]
    sha = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        data = path.read_bytes()
        sha.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        sha.update(data)
    return sha.hexdigest()[:16]


def _value_signature(value: Any) -> str:
    """dtype, shape and strides of a traced value (a tensor, or a tuple of them); its type otherwise."""
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{tuple(value.shape)}{tuple(value.stride())}"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_value_signature(v) for v in value) + ")"
    return type(value).__name__


def graph_digest(gm: torch.fx.GraphModule) -> str:
    """sha256 of every node of the traced step: name, op, target, arguments, and its value's dtype and shape."""
    h = hashlib.sha256()
    for node in gm.graph.nodes:
        h.update(f"{node.format_node()} :: {_value_signature(node.meta.get('val'))}\n".encode())
    return h.hexdigest()


#: (key, shape, dtype, device) of every tensor of a batch, by key
BatchSignature = tuple[tuple[str, tuple[int, ...], str, str], ...]


def batch_signature(batch: Mapping[str, torch.Tensor]) -> BatchSignature:
    """(key, shape, dtype, device) of every entry of a batch, by key."""
    return tuple(sorted((k, tuple(v.shape), str(v.dtype), str(v.device)) for k, v in batch.items()))


def qualified_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a function (a lambda's is ``module.<lambda>``; the traced graph holds its ops)."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def plan_key(fields: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The cache key of ``fields`` (32 hex digits of the sha256 of their sorted JSON) and the fields as they
    read back from JSON (tuples as lists), which a record stores."""
    text = json.dumps({"format": FORMAT, **fields}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32], json.loads(text)


def read_record(path: Path, fields: dict[str, Any]) -> dict[str, Any] | None:
    """The cached record at ``path`` made for ``fields``; None if there is none. A file that cannot be read, or
    that holds another key, is logged and taken as absent (the new plan replaces it)."""
    if not path.exists():
        return None
    try:
        record = read_json(path)
    except ArtifactError as exc:
        log.warning("plan cache: %s; planning again", exc)
        return None
    if not isinstance(record, dict) or record.get("key") != fields:
        log.warning("plan cache: %s was made for another step or format; planning again", path)
        return None
    return record


def new_record(fields: dict[str, Any], stages: list[dict[str, Any]]) -> dict[str, Any]:
    """The record of a plan made for ``fields`` (from :func:`plan_key`; :func:`read_record` reads it back)."""
    return {"key": fields, "stages": stages}
