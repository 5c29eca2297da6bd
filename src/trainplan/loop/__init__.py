"""Plans in the user's own loop: :func:`trainplan.plan` returns a :class:`PlannedModule` that trains the
model under a memory plan (docs/plan_api.md); plans are cached on disk (:mod:`trainplan.loop.cache`)."""

from trainplan.loop.errors import InfeasibleBudgetError, NewBatchShapeError
from trainplan.loop.module import PlannedModule, StepOutput
from trainplan.loop.api import plan
from trainplan.loop.report import PlanReport
from trainplan.loop.sac import SacExport, SacExportError, sac_policy

__all__ = ["InfeasibleBudgetError", "NewBatchShapeError", "PlanReport", "PlannedModule", "SacExport", "SacExportError",
           "StepOutput", "plan", "sac_policy"]
