"""Execute a recompute/swap plan on the real traced training step and validate it against its prediction.

Public API: :func:`load_plan` / :func:`parse_plan` (PlanError on a corrupt plan), :func:`build_plan`
(in-process plan for k stages), :func:`plan_stage` (one stage at any budget), :func:`run_plan` (the event
interpreter, the reference), :func:`trainplan.execute.compile.compile_plan` (the plan as straight-line fx
code), :func:`load_step` (a training step users call) and :func:`compile_step` (its compiling on a traced
step), :func:`validate_plan` (measure and compare), :func:`summary_rows`, :class:`ValidateSettings`,
:class:`Tolerances`.

The names below are imported on first use: importing a submodule (the plots and summaries read ``plan`` and
``predict``) does not import torch.
"""

from typing import Any

__all__ = [
    "ExecutionError",
    "GraphLayout",
    "PlanError",
    "PlannedStep",
    "RunResult",
    "StagePlan",
    "Tolerances",
    "ValidateSettings",
    "Validation",
    "build_plan",
    "compile_step",
    "load_plan",
    "load_step",
    "parse_plan",
    "plan_stage",
    "run_plan",
    "split_nodes",
    "stage_layouts",
    "summary_rows",
    "validate_plan",
]


def __getattr__(name: str) -> Any:
    """Each name imported from its own submodule on first use (only that submodule's imports run)."""
    if name in ("PlanError", "StagePlan", "build_plan", "load_plan", "parse_plan", "plan_stage", "split_nodes"):
        from trainplan.execute.plan import (PlanError, StagePlan, build_plan, load_plan, parse_plan, plan_stage,
                                            split_nodes)
    elif name == "summary_rows":
        from trainplan.execute.summary import summary_rows
    elif name == "Tolerances":
        from trainplan.execute.diagnose import Tolerances
    elif name in ("GraphLayout", "stage_layouts"):
        from trainplan.execute.layout import GraphLayout, stage_layouts
    elif name in ("ExecutionError", "RunResult", "run_plan"):
        from trainplan.execute.runner import ExecutionError, RunResult, run_plan
    elif name in ("PlannedStep", "compile_step", "load_step"):
        from trainplan.execute.step import PlannedStep, compile_step, load_step
    elif name in ("ValidateSettings", "Validation", "validate_plan"):
        from trainplan.execute.validate import ValidateSettings, Validation, validate_plan
    else:
        raise AttributeError(f"module 'trainplan.execute' has no attribute {name!r}")
    return locals()[name]
