"""One method of a frontier measured in this process: ``python -m trainplan.frontier.worker SPEC_JSON`` prints
``RESULT {json}`` (see :func:`trainplan.frontier.run.run_method`, which starts it in a fresh process)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from trainplan.execute.measure import process_peak_during
from trainplan.frontier.methods import Method, prepare
from trainplan.models import build_model
from trainplan.timing import return_freed_memory

RESULT = "RESULT "


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Train ``spec['model']`` under ``spec['method']``: ``warmup`` steps, then ``repeats`` steps each timed
    (wall seconds) and metered (the process's resident high-water mark above what it held before the step:
    :func:`trainplan.execute.measure.process_peak_during`)."""
    torch.set_num_threads(spec["threads"])
    return_freed_memory()
    built = build_model(spec["model"], spec["spec"], seed=spec["seed"])
    method = Method.parse(spec["method"])
    prepared = prepare(built, method, cache=Path(spec["cache"]), time_limit_s=spec["time_limit_s"])
    for _ in range(spec["warmup"]):  # on the meter's thread too, as the measured steps
        process_peak_during(prepared.step)
    times, peaks, losses = [], [], []
    for _ in range(spec["repeats"]):
        def timed() -> tuple[float, float]:
            t = time.perf_counter()
            loss = prepared.step()
            return time.perf_counter() - t, loss

        (seconds, loss), peak = process_peak_during(timed)
        times.append(seconds)
        peaks.append(peak)
        losses.append(loss)
    return {"model": spec["model"], "method": str(method), "setup_s": prepared.setup_s, "step_s": times,
            "peak_bytes": peaks, "losses": losses, "held_bytes": prepared.held(), **prepared.facts}


if __name__ == "__main__":
    print(RESULT + json.dumps(measure(json.loads(sys.argv[1]))), flush=True)
