"""Recompute from scratch: the least-memory way to run a graph where every op can be recomputed.

Each first compute (in program order) gets its missing inputs by recomputing them, depth first, each input's
own inputs likewise, the inputs of an op made in Sethi–Ullman order (Sethi and Ullman, JACM 1970: the one
that needs the most memory beyond its own output first). Kept with nothing cached, this needs at most
``fixed + max over ops of scratch_peaks`` bytes, whatever the budget: the budget at which a recompute-only
schedule is known to exist (:func:`scratch_bound`), at the cost of recomputing every ancestor once per path
(exponential in the depth of a wide graph). With the budget's slack used as a cache (:func:`scratch_events`),
it needs far fewer recomputes, and may fit a little below that bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainplan.schedule import deadline as dl
from trainplan.schedule.heuristic import Events
from trainplan.schedule.problem import Problem


@dataclass(frozen=True)
class ScratchBound:
    """A recompute-only schedule with this peak exists (fixed bytes included), made of ``computes`` computes
    taking ``time_s`` seconds: the from-scratch recursion, nothing cached."""

    bytes: int
    computes: float
    time_s: float
    peaks: tuple[int, ...]  # scratch_peaks, for the run


def _order(problem: Problem, peaks: list[int] | tuple[int, ...], ops: tuple[int, ...] | frozenset[int]) -> list[int]:
    """``ops`` in Sethi–Ullman order: the largest need beyond its own output first (then by index)."""
    return sorted(ops, key=lambda u: (problem.ops[u].bytes - peaks[u], u))


def _held_peak(problem: Problem, peaks: list[int], order: list[int]) -> tuple[int, int]:
    """(peak while making ``order`` one after another, each held once made; the bytes then held)."""
    held = peak = 0
    for u in order:
        peak = max(peak, held + peaks[u])
        held += problem.ops[u].bytes
    return peak, held


def scratch_peaks(problem: Problem) -> list[int]:
    """Bytes (fixed bytes not included) each op needs to be made from nothing: its inputs made in Sethi–Ullman
    order, each held once made, then its output and workspace."""
    peaks: list[int] = []
    for v, op in enumerate(problem.ops):
        peak, held = _held_peak(problem, peaks, _order(problem, peaks, problem.inputs[v]))
        peaks.append(max(peak, held + op.bytes + op.workspace))
    return peaks


def scratch_bound(problem: Problem) -> ScratchBound | None:
    """The budget at which the from-scratch recursion runs the graph, its computes and time; None if an op
    cannot be recomputed (its bytes would have to stay for its life)."""
    p = problem
    if not all(op.recompute for op in p.ops):
        return None
    peaks = scratch_peaks(p)
    keep = _order(p, peaks, p.keep_idx)
    end_peak, end_held = _held_peak(p, peaks, keep)  # the keep set made again at the end
    made: list[float] = []  # computes and seconds of making each op from nothing
    took: list[float] = []
    for v, op in enumerate(p.ops):
        made.append(1.0 + math.fsum(made[u] for u in p.inputs[v]))
        took.append(op.time + math.fsum(took[u] for u in p.inputs[v]))
    return ScratchBound(p.fixed_bytes + max(max(peaks, default=0), end_peak, end_held),
                        math.fsum(made) + math.fsum(made[u] for u in keep),
                        math.fsum(took) + math.fsum(took[u] for u in keep), tuple(peaks))


class _OutOfWork(Exception):
    pass


@dataclass
class _Run:
    """State of one cached from-scratch run: resident tensors, pins (held by an op being made), bytes used and
    the events so far."""

    problem: Problem
    peaks: tuple[int, ...]
    cap: int
    work_cap: float
    stop: dl.Deadline

    def __post_init__(self) -> None:
        p = self.problem
        self.orders = [_order(p, self.peaks, p.inputs[v]) for v in range(p.n)]
        self.resident: set[int] = set()
        self.pins = [0] * p.n
        self.used = 0
        self.work = 0
        self.step = 0
        self.events: Events = []

    def _tick(self) -> None:
        self.stop.check()
        self.work += 1
        if self.work > self.work_cap:
            raise _OutOfWork

    def _drop(self, u: int) -> None:
        self.resident.discard(u)
        self.used -= self.problem.ops[u].bytes
        self.events.append(("free", self.problem.ops[u].id))

    def _room(self, need: int) -> bool:
        """Evict unpinned tensors until ``need`` more bytes fit: those no later first compute reads first (this
        step's recomputed ancestors), then the one read furthest ahead (Belady). False if that is not enough."""
        p = self.problem
        while self.used + need > self.cap:
            best, victim = None, -1
            for u in self.resident:
                if self.pins[u]:
                    continue
                self._tick()
                nu = p.next_use(u, self.step)
                key = (nu is not None, -(nu or 0), -p.ops[u].bytes, u)
                if best is None or key < best:
                    best, victim = key, u
            if victim < 0:
                return False
            self._drop(victim)
        return True

    def _compute(self, v: int) -> bool:
        self._tick()
        op = self.problem.ops[v]
        if not self._room(op.bytes + op.workspace):
            return False
        self.events.append(("compute", op.id))
        self.resident.add(v)
        self.used += op.bytes
        return True

    def make(self, v: int, order: list[int]) -> bool:
        """Pin each input of ``v`` in ``order``, recomputing the missing ones depth first (explicit stack), then
        compute ``v`` (none for ``v < 0``); its inputs are unpinned after. False if the cap cannot be met."""
        pins = self.pins
        stack: list[list] = [[v, order, 0]]
        while stack:
            frame = stack[-1]
            x, ins, k = frame
            if k < len(ins):
                w = ins[k]
                if w in self.resident:
                    pins[w] += 1
                    frame[2] += 1
                else:
                    stack.append([w, self.orders[w], 0])
                continue
            if x >= 0 and not self._compute(x):
                return False
            for w in ins:
                pins[w] -= 1
            stack.pop()
            if stack:
                pins[x] += 1
                stack[-1][2] += 1
        return True

    def first_compute(self, i: int) -> bool:
        """Step i: make op i, then free what no later first compute reads."""
        self.step = i
        if not self.make(i, self.orders[i]):
            return False
        for u in [u for u in self.resident if self.problem.next_use(u, i + 1) is None]:
            self._drop(u)
        return True


def scratch_events(problem: Problem, budget_bytes: int, *, work_cap: float = math.inf,
                   stop: dl.Deadline | None = None, meter: list[int] | None = None,
                   bound: ScratchBound | None = None) -> Events | None:
    """A recompute-only schedule within ``budget_bytes``: each first compute recomputes its missing inputs from
    scratch in Sethi–Ullman order, what fits kept as a cache; None if an op cannot be recomputed, the cap is not
    met, or after ``work_cap`` units of work (computes and eviction candidates), or past ``stop`` (default: the
    call's deadline). ``meter``: gets the work done added to its first item. ``bound``: the problem's
    :func:`scratch_bound`, if the caller has it. Meets any budget of at least its ``bytes`` given the work."""
    bound = scratch_bound(problem) if bound is None else bound
    if bound is None:
        return None
    run = _Run(problem, bound.peaks, budget_bytes - problem.fixed_bytes, work_cap,
               dl.current() if stop is None else stop)
    try:
        ok = all(run.first_compute(i) for i in range(problem.n))
        # the keep set, recomputed where it was dropped, at the end
        ok = ok and run.make(-1, _order(problem, bound.peaks, problem.keep_idx))
    except (_OutOfWork, dl.OutOfTime):
        ok = False
    if meter is not None:
        meter[0] += run.work
    return run.events if ok else None
