"""Atomic, open-format artifact I/O (JSON, YAML, Parquet) with clear errors on corrupt files."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import yaml

from trainplan.errors import ArtifactError
from trainplan.schemas import check


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; move it onto ``path`` only if the block succeeds.

    The file gets the mode a plain ``open`` would give it (0o666 less the umask), not ``mkstemp``'s 0o600,
    so colleagues sharing the results directory can read it when the umask allows.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def current_umask() -> int:
    """The process's umask (read by setting and restoring it: the OS offers no read-only call)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=False, default=_default) + "\n")


def read_text(path: str | os.PathLike[str], what: str = "artifact") -> str:
    """The UTF-8 text of ``path``; a missing or unreadable file, or one that is not UTF-8 text (binary, or
    damaged), raises ArtifactError naming it as ``what``. The JSON and YAML readers start here."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ArtifactError(f"{what} not found: {path}") from exc
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{what} {path}: not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x}): "
                            "a binary or damaged file?") from None
    except OSError as exc:  # a directory, no permission
        raise ArtifactError(f"{what} {path}: cannot be read: {exc.strerror}") from exc


def read_json(path: str | os.PathLike[str], schema: str | None = None) -> Any:
    """Read a JSON artifact; a missing, binary or corrupt file, or one that does not match ``schema`` (a name in
    ``trainplan/schemas/``), raises ArtifactError naming it."""
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"corrupt JSON artifact {path}: {exc}") from exc
    if schema is not None:
        check(data, schema, str(path))
    return data


def read_yaml(path: str | os.PathLike[str], what: str = "artifact") -> Any:
    """Read a YAML file; a missing, binary or malformed one raises ArtifactError naming it as ``what``, with the
    line and column of a syntax error, on one line."""
    text = read_text(path, what)
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        context = f" ({exc.context})" if exc.context else ""
        raise ArtifactError(f"{what} {path}: invalid YAML{where}: {exc.problem}{context}") from None
    except yaml.YAMLError as exc:  # e.g. a control character the reader refuses
        raise ArtifactError(f"{what} {path}: invalid YAML: {' '.join(str(exc).split())}") from None


def write_yaml(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as YAML, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))


def write_table(path: str | os.PathLike[str], frame: pd.DataFrame) -> None:
    """Write a DataFrame as Parquet (``.parquet``) or CSV (``.csv``), atomically."""
    with atomic_path(path) as tmp:
        if str(path).endswith(".csv"):
            frame.to_csv(tmp, index=False)
        else:
            frame.to_parquet(tmp, index=False)


def read_table(path: str | os.PathLike[str], columns: list[str] | None = None) -> pd.DataFrame:
    """Read a Parquet/CSV artifact; a missing file, corrupt file or absent column raises ArtifactError."""
    try:
        if str(path).endswith(".csv"):
            frame = pd.read_csv(path)
        else:
            frame = pd.read_parquet(path)
    except FileNotFoundError as exc:
        raise ArtifactError(f"artifact not found: {path}") from exc
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise ArtifactError(f"corrupt table artifact {path}: {exc}") from exc
    missing = [c for c in columns or [] if c not in frame.columns]
    if missing:
        raise ArtifactError(f"artifact {path} lacks column(s) {missing}")
    return frame


def merged_yaml(paths: list[str | Path]) -> dict[str, Any]:
    """YAML files deep-merged in order (a later file's keys replace or extend an earlier one's), as snakemake's
    ``--configfile`` merges config files."""
    def merge(a: dict, b: dict) -> dict:
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out
    merged: dict[str, Any] = {}
    for path in paths:
        merged = merge(merged, read_yaml(path, "config file") or {})
    return merged
