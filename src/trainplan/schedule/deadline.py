"""One wall-clock deadline per solve call, seen by every step (heuristics, model building, CP-SAT, baselines).

``solve``/``compare`` open a :func:`scope`; code below asks :func:`current` (or is handed the
:class:`Deadline`) and stops when it has passed. Loops call :meth:`Deadline.check`, which raises
:class:`OutOfTime`; the step that owns the loop catches it and keeps what it had. A deterministic run's
answer changes only where this safety net fires (see :class:`TimeBudget` and mip.wall_cap).

A call's time is one :class:`TimeBudget`: its limit, charged by what each step used (deterministically, where the
run is deterministic), with the wall clock and the call's :class:`Deadline` as safety nets; a bisection's probes
draw on an :class:`Allowance` of work.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from trainplan.timing import live_objects_frozen


class OutOfTime(Exception):
    """The deadline passed inside a loop; the caller abandons the step."""


@dataclass(frozen=True)
class Deadline:
    """A ``time.perf_counter()`` instant; ``end = inf`` never passes."""

    end: float = math.inf

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.perf_counter() + seconds)

    def left(self) -> float:
        """Seconds until the deadline (negative once passed)."""
        return self.end - time.perf_counter()

    def passed(self) -> bool:
        return time.perf_counter() > self.end

    def check(self) -> None:
        """Raise OutOfTime once the deadline has passed."""
        if time.perf_counter() > self.end:
            raise OutOfTime

    def earlier(self, end: float | None) -> Deadline:
        """This deadline or ``end`` (a perf_counter instant), whichever comes first."""
        return self if end is None or end >= self.end else Deadline(end)


NEVER = Deadline()


@dataclass
class Allowance:
    """Work a step may still do, in seconds of its time limit. Each kind of work is charged at a fixed rate (units
    per second, as measured on the reference host), so the same work uses the same allowance on any machine."""

    seconds: float

    def units(self, per_second: float) -> int:
        """Units of work at ``per_second`` that the allowance still covers."""
        return max(0, int(self.seconds * per_second))

    def charge(self, units: float, per_second: float) -> None:
        self.seconds -= units / per_second

    def spent(self) -> bool:
        return self.seconds <= 0


@dataclass
class TimeBudget:
    """The time limit of one attempt. ``left()`` is what the next step may use: the wall-clock time left, or in a
    deterministic run the limit less what the steps were charged (CP-SAT's deterministic clocks), so every step's
    share, and with it the answer, is the same on any machine; ``wall_left()`` caps each step (a safety net).
    ``shorten`` cuts the limit (no fast schedule: time kept for the bisection), ``restore`` gives it back."""

    limit_s: float
    deterministic: bool
    wall_limit_s: float  # limit_s, or less in a bisection's final run (the probes' wall time is not charged)
    t0: float = field(default_factory=time.perf_counter)
    used_s: float = 0.0
    full: tuple[float, float] | None = None  # (limit_s, wall_limit_s) before ``shorten``

    def charge(self, seconds: float) -> None:
        self.used_s += seconds

    def wall_left(self) -> float:
        """Wall time left to this step: its own wall limit, or the call's deadline if that comes first."""
        return min(self.wall_limit_s - (time.perf_counter() - self.t0), current().left())

    def left(self) -> float:
        return self.limit_s - self.used_s if self.deterministic else self.wall_left()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def shorten(self, limit_s: float) -> None:
        self.full = (self.limit_s, self.wall_limit_s)
        self.limit_s = min(self.limit_s, limit_s)
        self.wall_limit_s = min(self.wall_limit_s, limit_s)

    @property
    def full_limit_s(self) -> float:
        """The limit before ``shorten``."""
        return self.limit_s if self.full is None else self.full[0]

    @property
    def shortened(self) -> bool:
        return self.full is not None and self.full != (self.limit_s, self.wall_limit_s)

    def restore(self) -> None:
        if self.full is not None:
            self.limit_s, self.wall_limit_s = self.full


_current: contextvars.ContextVar[Deadline] = contextvars.ContextVar("schedule_deadline", default=NEVER)


def current() -> Deadline:
    """The innermost open scope's deadline (NEVER outside any scope)."""
    return _current.get()


@contextlib.contextmanager
def scope(deadline: Deadline) -> Iterator[Deadline]:
    """Make ``deadline`` (or an earlier enclosing one) the current deadline inside the block. The outermost
    scope freezes the objects alive at its start (``live_objects_frozen``, no collection first) until it
    ends: a full garbage collection inside the call then scans only what the call allocated, not every object
    of the imported libraries (torch's alone took 0.07 s per collection here, 0.3 s under load: past a 2 s
    limit)."""
    outermost = current() is NEVER
    effective = current().earlier(deadline.end)
    token = _current.set(effective)
    try:
        with live_objects_frozen(collect=False) if outermost else contextlib.nullcontext():
            yield effective
    finally:
        _current.reset(token)
