"""The solve context: what every strategy of the portfolio reads and writes.

One :class:`Context` per attempt at one budget: the problem (whose ``budget_bytes`` is the budget: it lives nowhere
else), the incumbent (the best replay-valid schedule so far), the bound, one time budget every step draws from
(:class:`~trainplan.schedule.deadline.TimeBudget`, and in a bisection's probe a work allowance), the settings, the
run's options and a trace of the strategies (ran or skipped, why, what they gave), recorded in the schedule's
``extra["strategies"]``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from trainplan.schedule import deadline as dl
from trainplan.schedule.bounds import Bound
from trainplan.schedule.heuristic import Events
from trainplan.schedule.mip import MipResult, objective_ticks
from trainplan.schedule.problem import Problem
from trainplan.schedule.replay import ScheduleError, replay
from trainplan.schedule.retain import retain_recomputes
from trainplan.schedule.schedule_io import Schedule
from trainplan.schedule.settings import DEFAULTS, PortfolioSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    """How a call runs: CP-SAT's workers and seed, deterministic time, CP-SAT's grid (``copies``), its log, whether an
    unmet budget is raised by bisection, and the tuning."""

    workers: int = 2
    seed: int = 0
    deterministic: bool = True
    copies: int | None = None
    verbose: bool = False
    bisect: bool = True
    settings: PortfolioSettings = DEFAULTS


@dataclass(frozen=True)
class FastOptions:
    """How the fast schedules run. ``deadline_s``: once one is valid, the greedy runs stop this long after the
    start (a running one is abandoned, none starts), and the DTR-style plan's restarts and refinement are sized by
    it (None: no restarts, no refinement: a probe); ``first_deadline_s``: before one is valid, they stop there;
    always at the call's deadline. ``first_only``: stop at the first valid schedule, making only the DTR-style
    plans that hold no input past its last reader (they fail sooner where no plan exists): a bisection probe.
    ``chain_dp``: run the chain DP (a probe runs it itself, at least memory). ``greedy_work``: each greedy run's work
    cap (see ``heuristic.Simulator``)."""

    deadline_s: float | None = None
    first_deadline_s: float | None = None
    first_only: bool = False
    chain_dp: bool = True
    greedy_work: int | None = None

    @classmethod
    def attempt(cls, limit_s: float, settings: PortfolioSettings, keep_for_bisection: bool = False) -> FastOptions:
        """A full attempt's: the greedy runs stop after ``heuristic_share`` of the limit; before a first schedule, with
        the bisection on (``keep_for_bisection``), after ``no_heuristic_share`` of it."""
        return cls(deadline_s=settings.heuristic_share * limit_s,
                   first_deadline_s=settings.no_heuristic_share * limit_s if keep_for_bisection else None)


class Polished(NamedTuple):
    """Events polished (recomputes that fit kept instead) and their replayed time; both None if not valid."""

    events: Events | None
    time: float | None


@dataclass
class Incumbent:
    """The best replay-valid schedule so far: events, origin, replayed time, seconds to the first valid one."""

    events: Events | None = None
    name: str = ""
    time: float | None = None
    first: float | None = None


@dataclass
class Step:
    """One strategy in the trace: ran or skipped, why (its condition, in words), and what it gave."""

    name: str
    phase: str
    ran: bool
    why: str
    result: str | None = None
    final_run: list[Step] | None = None  # the bisection's: the strategies of its run at the found budget

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "phase": self.phase, "ran": self.ran, "why": self.why}
        if self.result is not None:
            out["result"] = self.result
        if self.final_run is not None:
            out["final_run"] = [s.to_dict() for s in self.final_run]
        return out


@dataclass
class FastRun:
    """The fast schedules' clock and shared state: their start, the call's deadline, the deadline before a first
    schedule, the greedy runs' deadline once one is valid, the greedy variants not yet run, and whether the greedy
    runs ended on time (then nothing more starts)."""

    t0: float
    call: dl.Deadline
    first_stop: dl.Deadline
    stop_at: float | None
    variants: list[Any] | None = None  # fast.greedy_variants, filled by the first greedy strategy
    out_of_time: bool = False

    @classmethod
    def start(cls, options: FastOptions) -> FastRun:
        t0 = time.perf_counter()
        call = dl.current()  # the call's deadline ends every run, even before a first valid schedule
        first_stop = call.earlier(None if options.first_deadline_s is None else t0 + options.first_deadline_s)
        return cls(t0, call, first_stop, None if options.deadline_s is None else t0 + options.deadline_s)


@dataclass
class Context:
    """One attempt at one budget (``problem.budget_bytes``). Strategies read the problem, the options and the time
    left, offer schedules (:meth:`offer`), set the bound and CP-SAT's result, charge the time they used, add the
    schedule's extra keys, and end the attempt (``ended``, with ``schedule`` where a proof answers it)."""

    problem: Problem
    time: dl.TimeBudget
    run: RunOptions
    fast: FastOptions
    fast_run: FastRun
    allowance: dl.Allowance | None = None  # a bisection probe's work (deterministic); None outside probes
    start: Events | None = None  # a schedule to improve: the bisection's, in its final run
    incumbent: Incumbent = field(default_factory=Incumbent)
    bound: Bound | None = None
    mip: MipResult | None = None
    mip_beside: bool = False  # CP-SAT ran beside the staged model
    extra: dict[str, Any] = field(default_factory=dict)
    trace: list[Step] = field(default_factory=list)
    ended: str | None = None  # why the rest of this attempt is skipped
    schedule: Schedule | None = None  # the answer, where a step ended the attempt with one (a proof)
    proof: str | None = None
    below_floor: bool = False  # the budget is below the memory floor and the bisection is on: no attempt at it
    final_run: list[Step] | None = None  # the bisection's run at the budget it found

    @classmethod
    def create(cls, problem: Problem, time_budget: dl.TimeBudget, run: RunOptions, fast: FastOptions,
               **state: Any) -> Context:
        return cls(problem, time_budget, run, fast, FastRun.start(fast), **state)

    @classmethod
    def detached(cls, problem: Problem, fast: FastOptions = FastOptions(), allowance: dl.Allowance | None = None,
                 run: RunOptions = RunOptions()) -> Context:
        """A context outside any time limit (the fast schedules' own options and the call's deadline still stop
        them): a bisection's probe (charged to ``allowance``), or strategies run on their own."""
        return cls.create(problem, dl.TimeBudget(math.inf, run.deterministic, math.inf), run, fast,
                          allowance=allowance)

    @property
    def budget(self) -> int:
        return self.problem.budget_bytes

    @property
    def settings(self) -> PortfolioSettings:
        return self.run.settings

    @property
    def can_swap(self) -> bool:
        return any(op.swap for op in self.problem.ops)

    def valid(self, events: Events | None) -> float | None:
        """Replayed time of ``events`` if they are valid within the budget, else None."""
        if events is None:
            return None
        try:
            return replay(self.problem, events, self.budget).time
        except ScheduleError as exc:
            log.warning("discarding an invalid schedule: %s", exc)
            return None

    def polish(self, events: Events | None) -> Polished:
        """``events`` with each recompute that fits replaced by keeping the tensor (:func:`retain_recomputes`), and
        their replayed time; (None, None) if ``events`` are not valid within the budget."""
        if self.valid(events) is None:
            return Polished(None, None)
        events = retain_recomputes(self.problem, events, self.budget, dl.current())
        return Polished(events, self.valid(events))

    def offer(self, found: Polished, name: str, first_at: float | None = None) -> bool:
        """Take ``found`` if it is valid and faster than the incumbent; True if taken. ``first_at``: the moment it was
        first valid (default: now). A probe ends at its first schedule."""
        inc = self.incumbent
        if found.time is None or (inc.time is not None and found.time >= inc.time):
            return False
        inc.events, inc.name, inc.time = found.events, name, found.time
        if inc.first is None:
            inc.first = (time.perf_counter() if first_at is None else first_at) - self.time.t0
        if self.fast.first_only:
            self.ended = "a probe stops at its first schedule"
        return True

    def at_bound(self) -> bool:
        """The incumbent meets the bound in objective ticks: optimal among all schedules (first computes in program
        order)."""
        return (self.incumbent.events is not None and self.bound is not None
                and objective_ticks(self.problem, self.incumbent.events) <= self.bound.ticks)
