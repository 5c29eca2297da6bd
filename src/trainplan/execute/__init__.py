"""Execute a recompute/swap plan on the real traced training step and validate it against its prediction.

Public API: :func:`load_plan` / :func:`parse_plan` (PlanError on a corrupt plan), :func:`build_plan`
(in-process plan for k stages), :func:`plan_stage` (one stage at any budget), :func:`run_plan` (the event
interpreter, the reference), :func:`trainplan.execute.compile.compile_plan` (the plan as straight-line fx
code), :func:`load_step` (a training step users call) and :func:`compile_step` (its compiling on a traced
step), :func:`validate_plan` (measure and compare), :func:`summary_rows`, :class:`ValidateSettings`,
:class:`Tolerances`.
"""

from trainplan.execute.diagnose import Tolerances
from trainplan.execute.layout import GraphLayout, stage_layouts
from trainplan.execute.plan import PlanError, StagePlan, build_plan, load_plan, parse_plan, plan_stage, split_nodes
from trainplan.execute.runner import ExecutionError, RunResult, run_plan
from trainplan.execute.step import PlannedStep, compile_step, load_step
from trainplan.execute.validate import ValidateSettings, Validation, summary_rows, validate_plan

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
