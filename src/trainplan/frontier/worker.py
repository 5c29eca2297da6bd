"""One method of a frontier measured in this process: ``python -m trainplan.frontier.worker SPEC_JSON`` prints
``RESULT {json}`` (see :func:`trainplan.frontier.run.run_method`, which starts it in a fresh process)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainplan.execute.measure import minor_faults, process_peaks_during
from trainplan.frontier.method_names import Method
from trainplan.frontier.methods import prepare
from trainplan.models import build_model
from trainplan.timing import keep_freed_memory, return_freed_memory

RESULT = "RESULT "


#: a step in a kept heap's steady state maps (almost) no new pages: fewer minor faults than this (4 MiB of pages)
STEADY_FAULTS = 1024
#: warm-up steps in the kept heap beyond ``warmup`` while a step still faults more: ResNet-50's plan at 0.5 took 3
#: steps (300k, 88k, 22k, then 7 faults) and timed 4.9 s against a steady 2.3 s after one
SETTLE_MAX = 5


def _settle(step: Callable[[], Any], warmup: int) -> list[int]:
    """Run ``step`` at least ``warmup`` times (at least once) and on, up to ``SETTLE_MAX`` more, until one maps
    fewer than ``STEADY_FAULTS`` new pages; the minor faults of each."""
    faults: list[int] = []
    while len(faults) < max(1, warmup) + SETTLE_MAX:
        before = minor_faults()
        step()
        faults.append(minor_faults() - before)
        if len(faults) >= max(1, warmup) and faults[-1] < STEADY_FAULTS:
            break
    return faults


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Train ``spec['model']`` under ``spec['method']``, prepared (compiled, or a plan traced, profiled and solved)
    with freed memory kept for reuse, so that a plan's profile times its ops as its steps are timed below:
    ``warmup`` steps, then ``repeats`` steps metered (the
    process's resident high-water mark above what it held before the step, freed memory returned to the system:
    :func:`trainplan.execute.measure.process_peaks_during`; read at the end of backward too, the peak that a plan
    without the optimizer budgets), then, with freed memory kept for reuse as a caching
    allocator does (:func:`trainplan.timing.keep_freed_memory`, as the profile and the validation time), warm-up
    steps until the heap is steady (:func:`_settle`) and ``repeats`` steps timed (wall seconds, with each step's
    minor page faults). Timed with freed memory returned, every allocation pays
    its page faults, which charges a plan's frees and re-allocations far more than a device's allocator would
    (ResNet-50's plan at 0.5: 7.2 s against eager's 5.1 s metered, 4.7 s against 5.2 s in a kept heap)."""
    torch.set_num_threads(spec["threads"])
    built = build_model(spec["model"], spec["spec"], seed=spec["seed"])
    method = Method.parse(spec["method"])
    preparing = keep_freed_memory()  # a plan's profile times its ops in the heap the steps are timed in
    prepared = prepare(built, method, cache=Path(spec["cache"]), time_limit_s=spec["time_limit_s"])
    metering = return_freed_memory()
    phases = (prepared.forward_backward, prepared.update)
    for _ in range(spec["warmup"]):  # on the meter's thread too, as the metered steps
        process_peaks_during(phases)
    peaks, backward_peaks, losses = [], [], []
    for _ in range(spec["repeats"]):
        (loss, _), (backward_peak, peak) = process_peaks_during(phases)
        peaks.append(peak)
        backward_peaks.append(backward_peak)
        losses.append(loss)
    timing = keep_freed_memory()
    settle = _settle(prepared.step, spec["warmup"])
    times, faults = [], []
    for _ in range(spec["repeats"]):
        before = minor_faults()
        start = time.perf_counter()
        prepared.step()
        times.append(time.perf_counter() - start)
        faults.append(minor_faults() - before)
    return {"model": spec["model"], "method": str(method), "setup_s": prepared.setup_s, "step_s": times,
            "peak_bytes": peaks, "backward_peak_bytes": backward_peaks, "losses": losses, "held_bytes": prepared.held(),
            "host_allocator": {"preparing": preparing, "metering": metering, "timing": timing},
            "settle_minor_faults": settle, "timed_minor_faults": faults, **prepared.facts}


if __name__ == "__main__":
    print(RESULT + json.dumps(measure(json.loads(sys.argv[1]))), flush=True)
