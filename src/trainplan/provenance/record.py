"""What produced a study: git commit and dirty flag, package versions, machine, resolved config, seeds."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("trainplan", "torch", "ortools", "snakemake", "transformers", "numpy", "pandas", "pyarrow",
            "snakemake-executor-plugin-slurm")


def git_state(repo: str | Path) -> dict[str, Any]:
    """Commit, dirty flag (tracked files changed) and changed paths of the git work tree at ``repo``; ``commit``
    is None outside a git tree (e.g. an unpacked archive, whose own provenance.json names its origin)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout
    try:
        commit = git("rev-parse", "HEAD").strip()
        changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None, "changed": []}
    return {"commit": commit, "dirty": bool(changed), "changed": changed}


def versions() -> dict[str, str | None]:
    """Python's and each package's installed version (None when a package is absent)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """Host, OS, CPU model, logical cores (all and usable by this process), memory, GPUs torch sees."""
    import torch

    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = None
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {
        "host": platform.node(),
        "os": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_bytes": memory,
        "gpus": gpus,
        "torch_cuda": torch.version.cuda,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }


def file_digests(root: str | Path, files: list[str]) -> dict[str, str]:
    """sha256 of each file (paths relative to ``root``), in sorted order."""
    out = {}
    for rel in sorted(files):
        digest = hashlib.sha256()
        with open(Path(root) / rel, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        out[rel] = digest.hexdigest()
    return out


def damaged_results(study: str | Path, recorded: dict[str, str]) -> dict[str, str]:
    """The files of ``recorded`` (path relative to ``study`` -> sha256, a provenance document's ``results``) that
    are 'missing' from ``study`` or 'changed' (another sha256), in sorted order."""
    current = file_digests(study, [name for name in recorded if (Path(study) / name).is_file()])
    return {name: "changed" if name in current else "missing"
            for name, digest in sorted(recorded.items()) if current.get(name) != digest}


def provenance(config: dict[str, Any], git: dict[str, Any], results: str | Path, exclude: str) -> dict[str, Any]:
    """The provenance document: code, software, machine, resolved config, seeds, and the sha256 of every
    file under ``results`` (but ``exclude``, the document itself) when it was written."""
    root = Path(results)
    files = [str(p.relative_to(root.parent)) for p in root.rglob("*")
             if p.is_file() and not p.name.startswith(".") and p.resolve() != Path(exclude).resolve()]
    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git": git,
        "versions": versions(),
        "machine": machine(),
        "seeds": {"seed": config.get("seed"), "solver": config.get("solver", {}).get("seed")},
        "config": config,
        "results": file_digests(root.parent, files),
    }
