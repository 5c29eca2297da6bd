"""``trainplan verify``: a finished study's result files against the sha256 its ``results/provenance.json``
recorded, and the one command that regenerates the damaged ones."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from trainplan.io import read_json, write_yaml
from trainplan.provenance.record import damaged_results

PROVENANCE = "results/provenance.json"
RECORDED_CONFIG = ".snakemake/trainplan/recorded_config.yaml"


def verify(study: str | Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The provenance document of ``study`` and its damaged result files (path -> 'changed' or 'missing');
    a missing or corrupt provenance document raises ArtifactError naming it."""
    record = read_json(Path(study) / PROVENANCE, schema="provenance")
    return record, damaged_results(study, record["results"])


def regenerate_command(study: str | Path, config: dict[str, Any], files: list[str]) -> str:
    """The snakemake command, run from the workflow's directory, that rebuilds ``files`` of ``study`` and reruns
    what depends on them (``results/provenance.json`` last).

    It runs under ``config``, the resolved config the provenance recorded, written to ``RECORDED_CONFIG`` in the
    study: with ``--replace-workflow-config`` the study's rules get the very params they ran with (as in a
    published archive), whatever config files the study was started with, so nothing else reruns.
    """
    root = Path(study).resolve()
    write_yaml(root / RECORDED_CONFIG, config)
    return shlex.join(["snakemake", "--directory", str(root), "--configfile", str(root / RECORDED_CONFIG),
                       "--replace-workflow-config", "--cores", "all", "--forcerun", *files])
