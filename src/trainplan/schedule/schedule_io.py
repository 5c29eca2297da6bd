"""The Schedule dataclass, built only from replayed events, and its JSON file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainplan.io import write_json
from trainplan.schedule.problem import Problem
from trainplan.schedule.replay import replay


BUDGET_STATUSES = ("met", "proven_infeasible", "not_found")  # what is known about the requested budget
HEAD_KEYS = ("status", "time", "peak_bytes", "budget_bytes", "bound", "gap", "solve_seconds", "method", "events")


@dataclass
class Schedule:
    """A schedule as written to JSON; ``time`` and ``peak_bytes`` always come from :func:`replay`."""

    status: str
    events: list[tuple[str, str]]
    time: float | None
    peak_bytes: int | None
    budget_bytes: int
    bound: float | None
    gap: float | None
    solve_seconds: float
    method: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the schedule is valid and within its budget (a raised one: within the raised budget)."""
        return self.status in ("optimal", "feasible", "raised")

    def to_dict(self) -> dict[str, Any]:
        head = {k: getattr(self, k) for k in HEAD_KEYS if k != "events"}
        return {**head, **self.extra, "events": [list(e) for e in self.events]}


@dataclass(frozen=True)
class Optimality:
    """What is known of a schedule's optimality: ``bound``, a lower bound on the time at its budget (gap = (time -
    bound) / time), and whether it is ``proven`` optimal."""

    bound: float | None = None
    proven: bool = False


def from_events(problem: Problem, events: list[tuple[str, str]], *, method: str, solve_seconds: float,
                optimality: Optimality = Optimality(), extra: dict[str, Any] | None = None) -> Schedule:
    """Replay ``events`` (must be valid) and build a Schedule at the problem's budget; status ``over_budget`` (extra
    ``over_budget: true``) if its peak exceeds the budget: a valid schedule, with its time and peak, that
    does not meet the budget. Its bound is ``optimality.bound``, at least the sum of op times."""
    budget_bytes = problem.budget_bytes
    rep = replay(problem, events)
    fits = rep.peak_bytes <= budget_bytes
    bound = max(optimality.bound or 0.0, problem.compute_time) if fits else None
    gap = max(0.0, (rep.time - bound) / rep.time) if fits and rep.time > 0 else (0.0 if fits else None)
    status = ("optimal" if optimality.proven or gap <= 1e-9 else "feasible") if fits else "over_budget"
    counts = {"recomputes": rep.recomputes, "swap_ins": rep.swap_ins, "swap_outs": rep.swap_outs}
    flag = {} if fits else {"over_budget": True}
    return Schedule(status, list(events), rep.time, rep.peak_bytes, budget_bytes, bound, gap,
                    solve_seconds, method, {**counts, **flag, **(extra or {})})


#: statuses of a schedule without events: proven infeasible (the note says by what), none found within
#: the limit (unknown), or the method's model was not built (too big for the limit)
NO_SCHEDULE_STATUSES = ("infeasible", "unknown", "not_built")


def set_budget_status(schedule: Schedule, status: str, proof: str | None = None) -> Schedule:
    """Record what is known about the requested budget: ``met`` (this schedule meets it),
    ``proven_infeasible`` (no schedule can; ``proof`` names the argument) or ``not_found`` (none was found
    within the time limit, and none is proven impossible). The one place a schedule's status says ``raised``:
    a valid schedule within a budget raised above ``requested_budget_bytes`` (the least one found)."""
    if status not in BUDGET_STATUSES or (proof is not None) != (status == "proven_infeasible"):
        raise ValueError(f"budget status {status!r} with proof {proof!r}")
    schedule.extra.update(budget_status=status, infeasibility_proof=proof)
    if schedule.ok and schedule.budget_bytes > schedule.extra.get("requested_budget_bytes", schedule.budget_bytes):
        schedule.status = "raised"
    return schedule


def no_schedule(budget_bytes: int, method: str, solve_seconds: float, note: str,
                extra: dict[str, Any] | None = None, status: str = "infeasible") -> Schedule:
    """A schedule without events: ``status`` says what is known (see NO_SCHEDULE_STATUSES)."""
    if status not in NO_SCHEDULE_STATUSES:
        raise ValueError(f"status {status!r} is not one of {NO_SCHEDULE_STATUSES}")
    return Schedule(status, [], None, None, budget_bytes, None, None, solve_seconds, method,
                    {"note": note, **(extra or {})})


def schedule_from_dict(problem: Problem, raw: dict[str, Any]) -> Schedule:
    """A schedule read back from its JSON, checked by replaying its events on ``problem``.

    Raises ScheduleError if the events are invalid, and ValueError if the stated time or peak is not
    what they replay to (the file was not written for this problem).
    """
    events = [(str(k), str(o)) for k, o in raw.get("events") or []]
    extra = {k: v for k, v in raw.items() if k not in HEAD_KEYS}
    if not events:
        return Schedule(raw["status"], [], None, None, int(raw["budget_bytes"]), None, None,
                        float(raw["solve_seconds"]), raw["method"], extra)
    rep = replay(problem, events)
    if rep.peak_bytes != raw["peak_bytes"] or abs(rep.time - float(raw["time"])) > 1e-9 * max(1.0, rep.time):
        raise ValueError(f"schedule ({raw['method']}) states time {raw['time']} s / peak {raw['peak_bytes']} B "
                         f"but its events replay to {rep.time} s / {rep.peak_bytes} B on this problem")
    return Schedule(raw["status"], events, rep.time, rep.peak_bytes, int(raw["budget_bytes"]), raw.get("bound"),
                    raw.get("gap"), float(raw["solve_seconds"]), raw["method"], extra)


def save_schedule(path: str | Path, schedule: Schedule) -> None:
    write_json(path, schedule.to_dict())
