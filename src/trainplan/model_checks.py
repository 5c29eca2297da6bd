"""The workflow's start-up check of the config's model entries (:func:`trainplan.models.check_spec`), done once
per entry: an entry that passed is recorded by a digest of the entry, the checking code and the versions of
torch and transformers, and is not checked again while all of these stay the same. Checking a transformers entry
imports torch and the model's transformers module (5-10 s on a 2-core machine), which every `snakemake` call
would otherwise pay before it starts, a dry run included."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from trainplan.io import atomic_path

MODELS_PY = Path(__file__).with_name("models.py")


def _source_file(spec: dict[str, Any]) -> Path | None:
    """The file of a callable entry's module, if it can be found (finding it may import its parent package)."""
    module_name = str(spec.get("callable", "")).partition(":")[0]
    try:
        found = importlib.util.find_spec(module_name) if module_name else None
    except (ImportError, ValueError):
        return None
    return Path(found.origin) if found is not None and found.origin and Path(found.origin).is_file() else None


def entry_digest(name: str, spec: dict[str, Any]) -> str | None:
    """Digest of what the check of one entry depends on; None where that cannot be told (a callable whose module
    file is not found: checked every time)."""
    code = [MODELS_PY]
    if spec.get("source", "transformers") == "callable":
        source = _source_file(spec)
        if source is None:
            return None
        code.append(source)
    versions = {}
    for package in ("torch", "transformers"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    sha = hashlib.sha256(json.dumps({"name": name, "spec": spec, "versions": versions}, sort_keys=True).encode())
    for path in code:
        sha.update(path.read_bytes())
    return sha.hexdigest()


def check_models(specs: dict[str, dict[str, Any]], record: Path) -> list[str]:
    """Check each entry not yet recorded as passed in ``record`` (one digest per line; rewritten atomically),
    raising :class:`trainplan.errors.ModelSpecError` for the first that fails. Returns the names checked now."""
    known = set(record.read_text().split()) if record.is_file() else set()
    checked = []
    for name, spec in specs.items():
        key = entry_digest(name, spec)
        if key is not None and key in known:
            continue
        from trainplan.models import check_spec  # imports torch: only when an entry needs checking

        check_spec(name, spec)
        checked.append(name)
        if key is not None:
            known.add(key)
    if checked:
        with atomic_path(record) as tmp:
            tmp.write_text("".join(f"{key}\n" for key in sorted(known)))
    return checked
