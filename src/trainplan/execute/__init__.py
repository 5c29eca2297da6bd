"""Execute a recompute/swap plan on the real traced training step and validate it against its prediction.

Public API: :func:`load_plan` / :func:`parse_plan` (PlanError on a corrupt plan), :func:`build_plan`
(in-process plan for k stages), :func:`run_plan` (the event executor), :func:`validate_plan` (measure
and compare), :func:`summary_rows`, :class:`ValidateSettings`, :class:`Tolerances`.
"""

from trainplan.execute.diagnose import Tolerances
from trainplan.execute.layout import GraphLayout, stage_layouts
from trainplan.execute.plan import PlanError, StagePlan, build_plan, load_plan, parse_plan, split_nodes
from trainplan.execute.runner import ExecutionError, RunResult, run_plan
from trainplan.execute.validate import ValidateSettings, Validation, summary_rows, validate_plan

__all__ = [
    "ExecutionError",
    "GraphLayout",
    "PlanError",
    "RunResult",
    "StagePlan",
    "Tolerances",
    "ValidateSettings",
    "Validation",
    "build_plan",
    "load_plan",
    "parse_plan",
    "run_plan",
    "split_nodes",
    "stage_layouts",
    "summary_rows",
    "validate_plan",
]
