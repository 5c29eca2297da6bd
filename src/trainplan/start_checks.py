"""The workflow's start-up checks that need torch, each done once: the config's model entries
(:func:`trainplan.models.check_spec`) and the fuse support tables (:func:`trainplan.fuse.support.load_table`,
which knows torch's op names). A check that passed is recorded by a digest of what it checked, the code that
checked it and the versions of torch and transformers, and is not run again while all of these stay the same.
Running one imports torch (and a model's transformers module: 5-10 s on a 2-core machine), which every
`snakemake` call, a dry run included, would otherwise pay before it starts."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from trainplan.io import atomic_path

PACKAGE = Path(__file__).parent


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for package in ("torch", "transformers"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


@dataclass
class CheckRecord:
    """The digests of the checks that passed, one per line in ``path`` (rewritten atomically)."""

    path: Path
    known: set[str] = field(init=False)

    def __post_init__(self) -> None:
        self.known = set(self.path.read_text().split()) if self.path.is_file() else set()

    def once(self, what: Any, code: list[Path] | None, check: Callable[[], object]) -> bool:
        """Run ``check`` (it raises if the check fails) unless one of the same ``what`` (JSON data), ``code``
        files and package versions passed before; ``code`` None: the code is not known, always run it. Returns
        whether it ran."""
        key = None
        if code is not None:
            sha = hashlib.sha256(json.dumps({"what": what, "versions": _versions()}, sort_keys=True).encode())
            for path in code:
                sha.update(path.read_bytes())
            key = sha.hexdigest()
            if key in self.known:
                return False
        check()
        if key is not None:
            self.known.add(key)
            try:
                with atomic_path(self.path) as tmp:
                    tmp.write_text("".join(f"{k}\n" for k in sorted(self.known)))
            except OSError:
                pass  # an unwritable cache: the check runs again next time, nothing else changes
        return True


def default_record() -> CheckRecord:
    """The user's record, shared by every study and checkout: a digest names what was checked and by which code,
    so a record made elsewhere is as good (``$XDG_CACHE_HOME`` or ``~/.cache``, ``trainplan/start_checks``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return CheckRecord(Path(cache) / "trainplan" / "start_checks")


def _module_file(spec: dict[str, Any]) -> Path | None:
    """The file of a callable entry's module, if it can be found (finding it may import its parent package)."""
    module_name = str(spec.get("callable", "")).partition(":")[0]
    try:
        found = importlib.util.find_spec(module_name) if module_name else None
    except (ImportError, ValueError):
        return None
    return Path(found.origin) if found is not None and found.origin and Path(found.origin).is_file() else None


def check_models(specs: dict[str, dict[str, Any]], record: CheckRecord) -> list[str]:
    """Check each model entry not checked before (:func:`trainplan.models.check_spec`: its
    :class:`trainplan.errors.ModelSpecError` names the model and key); a callable entry is checked again when its
    module's file changes. Returns the names checked now."""
    checked = []
    for name, spec in specs.items():
        code: list[Path] | None = [PACKAGE / "models.py"]
        if spec.get("source", "transformers") == "callable":
            module = _module_file(spec)
            code = None if module is None else [*code, module]

        def check(name: str = name, spec: dict[str, Any] = spec) -> None:
            from trainplan.models import check_spec  # imports torch: only when an entry needs checking

            check_spec(name, spec)

        if record.once({"model": name, "spec": spec}, code, check):
            checked.append(name)
    return checked


def check_table(path: str | Path, record: CheckRecord) -> bool:
    """Load the fuse support table at ``path`` unless the same content passed before (its
    :class:`trainplan.fuse.errors.FuseError` names the file and the op); whether it was loaded now."""
    try:
        content = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        content = None  # load_table names the missing or unreadable file

    def check() -> None:
        from trainplan.fuse.support import load_table

        load_table(path)

    return record.once({"support_table": content}, None if content is None else [PACKAGE / "fuse" / "support.py"],
                       check)
