"""One rank of a pipeline run under torchrun: ``python -m trainplan.pipeline.worker SETTINGS.json``, the settings
written by :mod:`~trainplan.pipeline.launch` (:meth:`RunSettings.to_dict`)."""

from __future__ import annotations

import sys
from typing import Any

from trainplan.errors import ArtifactError
from trainplan.io import read_json
from trainplan.pipeline.errors import PipelineError
from trainplan.pipeline.run import RunSettings, run_pipeline


def summary_line(settings: RunSettings, out: dict[str, Any]) -> str:
    """What rank 0 prints once it wrote the artifact."""
    pred = out["prediction"]
    return (f"{settings.artifact}: {settings.schedule} k={out['k']} m={settings.micro_batches} loss={out['loss']:.6g} "
            f"step={out['measured']['step_s']:.4g} s (predicted {pred['step_time_s']:.4g} s, "
            f"{pred['step_time_with_comm_s']:.4g} s with the measured send/receive)")


def main(argv: list[str] | None = None) -> int:
    """Run this rank; rank 0 prints where it wrote the artifact. A refused plan or setting: one line, exit 2."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m trainplan.pipeline.worker SETTINGS.json (under torchrun)", file=sys.stderr)
        return 2
    settings = RunSettings.from_dict(read_json(args[0]))
    try:
        out = run_pipeline(settings)
    except (PipelineError, ArtifactError) as exc:
        print(f"trainplan pipeline worker: error: {exc}", file=sys.stderr)
        return 2
    if out is not None:
        print(summary_line(settings, out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
