"""Running the workflow as a subprocess on a test config (shared by the workflow and report tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "config" / "config.yaml"


def snakemake(workdir: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m snakemake`` on the repo's Snakefile in ``workdir`` with ``config`` layered over the default."""
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--cores", "2", *args, "--configfile", str(config)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
