"""trainplan: plan memory, pipeline stages and precision of a PyTorch training step.

``trainplan.load_step(plan_dir, model, batch)`` returns a training step compiled under a plan
(:func:`trainplan.execute.step.load_step`).
"""

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "load_step":  # imported on first use: importing trainplan stays free of torch
        from trainplan.execute.step import load_step

        return load_step
    raise AttributeError(f"module 'trainplan' has no attribute {name!r}")
