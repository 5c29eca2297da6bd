"""Worker process of the conv sweep: reads ``{"layouts", "timing", "shapes", "input_grad", "deadline"}`` as JSON on
stdin, times each shape in every layout and writes one JSON line of times (or of the error torch raised) per shape
on stdout, in order, starting no shape after the deadline (``time.time()`` seconds, or null: none). Run as
``python -m trainplan.layout.sweep_worker``; a shape that crashes PyTorch ends the process, and the caller
(:func:`trainplan.layout.measure.time_in_worker`) knows which one from the lines written."""

from __future__ import annotations

import json
import sys
import time

import torch

from trainplan.layout.graph import ConvInfo
from trainplan.layout.measure import Timing, conv_time
from trainplan.timing import gc_paused, keep_freed_memory, live_objects_frozen


def conv_info(fields: dict) -> ConvInfo:
    """A ConvInfo from its JSON fields (tuples stored as lists)."""
    return ConvInfo(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def main() -> None:
    """Time the shapes given on stdin, with freed host memory kept (``keep_freed_memory``); one line per shape
    on stdout, until the shapes or the time run out."""
    keep_freed_memory()
    job = json.load(sys.stdin)
    timing = Timing(**job["timing"])
    torch.set_num_threads(timing.threads)
    with live_objects_frozen():  # torch's own objects out of each shape's collection
        for fields, input_grad in zip(job["shapes"], job["input_grad"]):
            if job["deadline"] is not None and time.time() >= job["deadline"]:
                break
            conv = conv_info(fields)
            times = {}
            try:
                with gc_paused():  # one collection per shape
                    for lay in job["layouts"]:
                        times[f"fwd_{lay}"], times[f"bwd_{lay}"] = conv_time(conv, lay, timing, input_grad)
            except (RuntimeError, ValueError) as exc:  # torch refuses the shape: say so and go on
                times = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            print(json.dumps(times), flush=True)


if __name__ == "__main__":
    main()
