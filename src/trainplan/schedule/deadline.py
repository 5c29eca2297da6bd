"""One wall-clock deadline per solve call, seen by every step (heuristics, model building, CP-SAT, baselines).

``solve``/``compare`` open a :func:`scope`; code below asks :func:`current` (or is handed the
:class:`Deadline`) and stops when it has passed. Loops call :meth:`Deadline.check`, which raises
:class:`OutOfTime`; the step that owns the loop catches it and keeps what it had. A deterministic run's
answer changes only where this safety net fires (see solve._Clock and mip.wall_cap).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

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
