"""``trainplan publish``: one .tar.gz of the code, the resolved config and a finished study's results."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import yaml

from trainplan.errors import ArtifactError
from trainplan.io import atomic_path, read_json
from trainplan.provenance.verify import PROVENANCE, verify

STUDY_DIRS = ("results", "logs", "benchmarks", ".snakemake/metadata")
CONFIG = "config/published.yaml"
HOWTO = """# Published trainplan study

Code (git commit {commit}{dirty}), resolved config ({config}), results, logs, benchmarks and Snakemake's
metadata of the study. `results/provenance.json` records the software versions, the machine, the seeds
and the sha256 of every result file. To rebuild the report (nothing is recomputed: the results are up to
date for this code and config):

    python3 -m venv .venv && . .venv/bin/activate && pip install torch=={torch} && pip install -e .
    snakemake --configfile {config} --replace-workflow-config --dry-run   # nothing to be done
    snakemake --configfile {config} --replace-workflow-config --report report.html

(`--replace-workflow-config`: the study's resolved config alone, not merged into config/config.yaml.)
"""


class PublishError(ArtifactError):
    """The study cannot be published as it stands (no provenance, results changed since, no git tree)."""


def tracked_files(repo: Path) -> list[str]:
    """Files git tracks in ``repo`` (their working-tree content is archived, as it produced the study)."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise PublishError(f"{repo}: not a git work tree; publish archives the files git tracks") from exc
    return [name for name in out.decode().split("\0") if name and (repo / name).is_file()]


def study_files(study: Path) -> list[str]:
    """Result, log, benchmark and Snakemake metadata files of the study (paths relative to it)."""
    return sorted(str(p.relative_to(study)) for d in STUDY_DIRS if (study / d).is_dir()
                  for p in (study / d).rglob("*") if p.is_file() and not p.name.startswith(".nfs"))


def relocated_metadata(record: dict[str, Any], repo: Path) -> str:
    """A Snakemake metadata record with the inputs found in the repository (config-named files of a study
    run with ``--directory`` elsewhere: common.smk's ``study_file``) renamed to their path in the archive,
    where the repository is the working directory; otherwise the unpacked study sees a changed set of
    input files and reruns."""
    prefixes = {str(repo.absolute()) + "/", str(repo.resolve()) + "/"}  # as recorded, and with links resolved

    def local(name: str) -> str:
        for prefix in prefixes:
            if isinstance(name, str) and name.startswith(prefix):
                return name.removeprefix(prefix)
        return name

    if isinstance(record.get("input"), list):
        record["input"] = [local(name) for name in record["input"]]
    if isinstance(record.get("input_checksums"), dict):
        record["input_checksums"] = {local(name): digest for name, digest in record["input_checksums"].items()}
    return json.dumps(record)


def publish(study: str | Path, repo: str | Path, output: str | Path) -> list[str]:
    """Write ``output`` (.tar.gz, one top folder named after it); returns the archived paths.

    Refuses (PublishError naming the file) when ``results/provenance.json`` is missing or a result file
    changed since it was written: the archive must be what the provenance describes.
    """
    study, repo = Path(study), Path(repo)
    record, damaged = verify(study)
    if damaged:
        name, state = next(iter(damaged.items()))
        raise PublishError(f"{study / name}: {state} since {study / PROVENANCE} was written ({len(damaged)} result "
                           f"file(s) damaged or missing); `trainplan verify -d {study}` names each and prints the "
                           "command that regenerates them")
    code = [f for f in tracked_files(repo) if not any(f.startswith(d + "/") for d in STUDY_DIRS)]
    top = Path(output).name.removesuffix(".gz").removesuffix(".tar").removesuffix(".tgz")
    git = record["git"]
    howto = HOWTO.format(commit=git["commit"], dirty=", with uncommitted changes" if git["dirty"] else "",
                         config=CONFIG, torch=record["versions"]["torch"])
    extra = {CONFIG: yaml.safe_dump(record["config"], sort_keys=False), "PUBLISHED.md": howto}
    members = [*code, *study_files(study), *extra]
    with atomic_path(output) as tmp, tarfile.open(tmp, "w:gz") as tar:
        for name in code:
            tar.add(repo / name, arcname=f"{top}/{name}", recursive=False)
        for name in study_files(study):
            if name.startswith(".snakemake/metadata/"):
                add_text(tar, f"{top}/{name}", relocated_metadata(read_json(study / name), repo),
                         int((study / name).stat().st_mtime))
            else:
                tar.add(study / name, arcname=f"{top}/{name}", recursive=False)
        for name, text in extra.items():
            add_text(tar, f"{top}/{name}", text, int(Path(study / PROVENANCE).stat().st_mtime))
    return members


def add_text(tar: tarfile.TarFile, arcname: str, text: str, mtime: int) -> None:
    """Add ``text`` to ``tar`` as a regular file (mode 644) named ``arcname``."""
    data = text.encode()
    info = tarfile.TarInfo(arcname)
    info.size, info.mode, info.mtime = len(data), 0o644, mtime
    tar.addfile(info, io.BytesIO(data))
