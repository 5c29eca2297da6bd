"""Running the workflow as a subprocess on a test config (shared by the workflow and report tests)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "config" / "config.yaml"


def _rules_taking_every_core() -> list[str]:
    """The rules declared ``threads: workflow.cores`` (those that time: they take the machine to themselves)."""
    rules = []
    for path in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        rule = None
        for line in path.read_text().splitlines():
            if found := re.match(r"rule (\w+):", line):
                rule = found.group(1)
            elif rule and line.strip() == "threads: workflow.cores":
                rules.append(rule)
    return rules


#: Those rules given one thread each in the tiny study: its jobs are mostly interpreter start-up and imports (one
#: core), so two run side by side on the 2-core CI host. Its times are then taken under load: no test of the tiny
#: study checks a timing against a tolerance (the validate tests raise theirs to 1e9).
SHARED_CORES = ("--set-threads", *(f"{rule}=1" for rule in _rules_taking_every_core()))


def snakemake(workdir: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m snakemake`` on the repo's Snakefile in ``workdir`` with ``config`` layered over the default."""
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--cores", "2", *args, "--configfile", str(config)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)


def copy_of_study(study: Path, dest: Path) -> Path:
    """A copy of a finished study at ``dest`` (results, logs, Snakemake's metadata), file times kept so that only
    what a changed config or target touches reruns there. Tests that rerun or alter a study work in a copy: the
    session's tiny study stays as its rules left it, whatever order the tests run in."""
    shutil.copytree(study, dest, symlinks=True)
    return dest
