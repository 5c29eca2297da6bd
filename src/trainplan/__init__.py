"""trainplan: plan memory, pipeline stages and precision of a PyTorch training step.

``trainplan.plan(model, batch, budget="2GiB")`` returns a module that trains ``model`` under a memory plan in
any loop (:func:`trainplan.loop.api.plan`); ``trainplan.load_step(plan_dir, model, batch)`` returns a training
step compiled under a plan of the workflow (:func:`trainplan.execute.step.load_step`).
"""

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "load_step":  # imported on first use: importing trainplan stays free of torch
        from trainplan.execute.step import load_step

        return load_step
    if name == "plan":
        from trainplan.loop.api import plan

        return plan
    raise AttributeError(f"module 'trainplan' has no attribute {name!r}")
