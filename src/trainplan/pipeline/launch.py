"""Launch a pipeline run: ``torchrun --standalone`` with one process per rank (per stage, or per v stages under
Interleaved1F1B), each running
:mod:`~trainplan.pipeline.worker` on the run's settings (handed over in a JSON file)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

from trainplan.io import write_json
from trainplan.pipeline import worker
from trainplan.pipeline.run import RunSettings


def torchrun_command(settings_file: Path, ranks: int) -> list[str]:
    """The command running ``ranks`` ranks of the worker on ``settings_file`` on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
            "-m", worker.__name__, str(settings_file)]


def launch(settings: RunSettings, ranks: int, *, output: IO[str] | None = None) -> int:
    """Run the plan's ``ranks`` ranks with ``settings`` (rank 0 writes ``settings.artifact``); their output goes to
    ``output`` (default: this process's). Returns torchrun's exit status (non-zero: a rank failed, its message
    in the output)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(settings.threads)}
    with tempfile.TemporaryDirectory(prefix="trainplan-pipeline-") as tmp:
        path = Path(tmp) / "settings.json"
        write_json(path, settings.to_dict())
        done = subprocess.run(torchrun_command(path, ranks), env=env, stdout=output, stderr=output, check=False)
    return done.returncode
