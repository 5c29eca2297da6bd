"""The layout stage's settings as the rules use them: the model spec at the stage's size, and its timing."""

from __future__ import annotations

from typing import Any

from trainplan.layout.measure import Timing


def layout_spec(spec: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """The model's config entry at the layout stage's batch and image size (kept small on a CPU)."""
    spec = dict(spec)
    size = {"batch_size": settings["batch_size"], "image_size": settings["image_size"]}
    if spec.get("source", "transformers") == "callable":
        spec["kwargs"] = {**spec.get("kwargs", {}), **size}
    else:
        spec["inputs"] = {**spec.get("inputs", {}), **size}
    return spec


def timing_of(settings: dict[str, Any], repeats_key: str = "repeats", device: str = "cpu") -> Timing:
    """The Timing a settings block asks for (``repeats_key``: repeats or step_repeats) on ``device``; ``calls``
    where the block has it (the per-op timings), else one."""
    return Timing(int(settings[repeats_key]), int(settings["warmup"]), int(settings["threads"]), settings["clock"],
                  device, int(settings.get("calls", 1)))
