"""What a plan promises and where it came from: ``planned.report``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainplan.budget import format_bytes
from trainplan.execute.plan import StagePlan
from trainplan.schedule.stage_problem import no_recompute_peak

#: ``met``: the plan meets the requested budget; ``raised``: no schedule was found within it in the time limit
#: (it may exist), the plan meets the least budget found; ``proven_infeasible``: no schedule can meet it, the
#: plan meets the least budget found
STATUSES = ("met", "raised", "proven_infeasible")


@dataclass(frozen=True)
class PlanReport:
    """One plan of a planned module. Bytes are the stage's device bytes as the plan counts them: parameters,
    buffers, the batch, activations, gradients and temporaries, and with the optimizer in the step its state
    (``optimizer_state_bytes``, resident throughout) and its updates' temporaries (docs/plan_api.md)."""

    requested_budget_bytes: int
    planned_budget_bytes: int  # the requested budget, or the least one found where that is not met
    status: str  # one of STATUSES
    predicted_peak_bytes: int
    predicted_step_s: float
    no_recompute_peak_bytes: int  # the step's peak without recomputes or swaps
    floor_bytes: int  # no schedule peaks lower (proven)
    solve_s: float  # seconds the solver took when the plan was made
    cache_hit: bool
    cache_path: Path
    plan_s: float  # seconds this plan took to get: tracing, then the cache or profiling and solving, compiling
    trace_s: float  # of plan_s, the seconds tracing the step took (its tables and the updates' pass included)
    optimizer_state_bytes: int = 0  # with the optimizer in the step: its state, counted in every peak above

    @classmethod
    def of(cls, stage: StagePlan, *, cache_hit: bool, cache_path: Path, plan_s: float, trace_s: float) -> PlanReport:
        """The report of a one-stage plan's scheduled ``stage``."""
        sched = stage.schedule
        requested = int(sched.get("requested_budget_bytes", sched["budget_bytes"]))
        status = ("met" if sched["status"] != "raised"  # the schedule's own status (schedule_io.set_budget_status)
                  else "proven_infeasible" if sched["budget_status"] == "proven_infeasible" else "raised")
        return cls(requested, int(sched["budget_bytes"]), status, int(sched["peak_bytes"]), float(sched["time"]),
                   no_recompute_peak(stage.raw), stage.problem.floor_bytes, float(sched["solve_seconds"]),
                   cache_hit, cache_path, plan_s, trace_s, int(stage.raw.get("optimizer_state_bytes", 0)))

    def __str__(self) -> str:
        budget = format_bytes(self.planned_budget_bytes)
        if self.status != "met":
            budget += f" ({self.status} from {format_bytes(self.requested_budget_bytes)})"
        source = "cache hit" if self.cache_hit else f"profiled and solved (solver {self.solve_s:.1f} s)"
        return (f"plan: budget {budget}, predicted peak {format_bytes(self.predicted_peak_bytes)} "
                f"(no recompute: {format_bytes(self.no_recompute_peak_bytes)}), step {self.predicted_step_s * 1e3:.1f} "
                f"ms; {source} in {self.plan_s:.1f} s (trace {self.trace_s:.1f} s); {self.cache_path}")
