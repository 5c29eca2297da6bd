"""Greedy simulation of the program order with eviction (swap or drop-and-recompute) under a cap.

The same engine, with other knobs, gives the no-recompute, swap-only and sqrt(n) baselines.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from trainplan.schedule import deadline as dl
from trainplan.schedule.problem import Problem

Events = list[tuple[str, str]]
POLICIES = ("cost", "belady")
INF = math.inf


class _OverTimeCap(Exception):
    """A run's computes already take longer than its ``time_cap``, or it has done its ``work_cap``."""


@dataclass(frozen=True)
class Limits:
    """When a greedy run is abandoned (see :class:`Simulator`): past ``stop_at`` (a ``time.perf_counter()``
    instant), once its computes take longer than ``time_cap`` seconds, after ``work_cap`` units of work."""

    stop_at: float | None = None
    time_cap: float | None = None
    work_cap: float | None = None


class Simulator:
    """Runs ops in program order, rematerialising missing inputs and evicting to stay under a cap.

    ``budget_bytes=None`` never evicts. ``policy`` picks the eviction victim: "belady" = furthest
    next use (then largest), "cost" = cheapest restore cost per byte and step held. The eviction
    action (swap out vs drop) and the restore action (swap in vs recompute) are chosen by cost.
    ``limits.stop_at`` (a ``time.perf_counter()`` instant) abandons the run when it is passed, as does the
    current deadline (``deadline.current()``) for a run under a cap or with an ``after_step`` hook (a plain
    uncapped run is linear and always completes); the loops check it at every eviction candidate and
    rematerialisation, so a run ends within milliseconds of it. ``limits.time_cap`` abandons the run once its
    computes' op time (a lower bound on the schedule's time) exceeds it: it cannot beat a schedule that fast.
    ``limits.work_cap`` abandons it after that many of those checks (a deterministic bound, the same on any
    machine).
    """

    def __init__(self, problem: Problem, budget_bytes: int | None, *, allow_swap: bool = True,
                 allow_recompute: bool = True, policy: str = "belady", limits: Limits = Limits()) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        self.p = problem
        self.cap = None if budget_bytes is None else budget_bytes - problem.fixed_bytes
        self.allow_swap, self.allow_recompute, self.policy = allow_swap, allow_recompute, policy
        self.deadline = dl.current().earlier(limits.stop_at)
        self.resident: set[int] = set()
        self.host: set[int] = set()
        self.used = 0
        time_cap = limits.time_cap
        self.time_cap = INF if time_cap is None else time_cap * (1 + 1e-9)  # a running sum: prune surely slower runs
        self.compute_time = 0.0
        self.work_cap = INF if limits.work_cap is None else limits.work_cap
        self.work_done = 0  # units of work (see _tick)
        self.events: Events = []
        self.touched: list[int] = []
        # restore_cost depends only on (resident, host); every change to either clears this cache
        self._restore: dict[int, float] = {}

    def _tick(self) -> None:
        """One unit of work (an eviction candidate or a rematerialisation step): past the deadline or the work
        cap, abandon the run."""
        self.deadline.check()
        self.work_done += 1
        if self.work_done > self.work_cap:
            raise _OverTimeCap

    def can_swap(self, u: int) -> bool:
        return self.allow_swap and self.p.ops[u].swap

    def can_recompute(self, u: int) -> bool:
        return self.allow_recompute and self.p.ops[u].recompute

    def _emit(self, kind: str, u: int) -> None:
        self.events.append((kind, self.p.ops[u].id))

    def _bring(self, kind: str, u: int) -> None:
        """Make ``u`` resident by ``kind`` (``compute`` or ``swap_in``)."""
        self._emit(kind, u)
        self.resident.add(u)
        self._restore.clear()
        self.used += self.p.ops[u].bytes
        self.touched.append(u)
        if kind == "compute":
            self.compute_time += self.p.ops[u].time
            if self.compute_time > self.time_cap:
                raise _OverTimeCap

    def free(self, u: int) -> None:
        self._emit("free", u)
        self.resident.discard(u)
        self._restore.clear()
        self.used -= self.p.ops[u].bytes

    def restore_cost(self, u: int) -> float:
        """Estimated seconds to make a non-resident u resident again (inf if impossible).

        Iterative (no recursion limit) and cached: the value is a pure function of the resident and
        host sets, and every change to either clears the cache, so results equal the plain recursion
        min(swap-in, op time + sum of the inputs' restore costs)."""
        if u in self.resident:
            return 0.0
        cache = self._restore
        if u in cache:
            return cache[u]
        p, resident = self.p, self.resident
        stack = [u]
        while stack:
            v = stack[-1]
            if v in cache:
                stack.pop()
                continue
            rc_ok = self.can_recompute(v)
            if rc_ok:
                pending = [w for w in p.inputs[v] if w not in resident and w not in cache]
                if pending:
                    stack.extend(pending)
                    continue
            stack.pop()
            best = INF
            if v in self.host and self.can_swap(v):
                best = p.transfer_time(v)
            if rc_ok:
                rc = p.ops[v].time + sum(0.0 if w in resident else cache[w] for w in p.inputs[v])
                best = min(best, rc)
            cache[v] = best
        return cache[u]

    def evict_cost(self, u: int, t: int) -> tuple[float, bool]:
        """(cost, by_swap) of evicting u now and bringing it back at its next use."""
        if self.p.next_use(u, t) is None:
            return 0.0, False
        swap = INF
        if self.can_swap(u):
            swap = (0.0 if u in self.host else self.p.transfer_time(u)) + self.p.transfer_time(u)
        drop = INF
        if self.can_recompute(u):
            drop = self.p.ops[u].time + sum(self.restore_cost(w) for w in self.p.inputs[u])
        return (swap, True) if swap <= drop else (drop, False)

    def make_room(self, need: int, protected: set[int], t: int) -> bool:
        """Evict until ``need`` more bytes fit; False if nothing evictable is left."""
        if self.cap is None:
            return True
        while self.used + need > self.cap:
            best: tuple[float, ...] | None = None
            victim = -1
            for u in self.resident:
                if u in protected:
                    continue
                self._tick()
                cost, _ = self.evict_cost(u, t)
                if cost == INF:
                    continue
                nu = self.p.next_use(u, t)
                dist = (self.p.n + 1 if nu is None else nu) - t + 1
                size = self.p.ops[u].bytes
                if self.policy == "belady":
                    key = (-(nu is None), -dist, -size, u)
                else:
                    key = (-(nu is None), cost / (max(size, 1) * dist), -size, u)
                if best is None or key < best:
                    best, victim = key, u
            if victim < 0:
                return False
            self.evict(victim, t)
        return True

    def evict(self, u: int, t: int) -> None:
        """Free u now, swapping it out first when that is the cheaper way to get it back."""
        cost, by_swap = self.evict_cost(u, t)
        if by_swap and cost > 0 and u not in self.host:
            self._emit("swap_out", u)
            self.host.add(u)
            self._restore.clear()
        self.free(u)

    def ensure(self, u: int, protected: set[int], t: int) -> bool:
        """Make u resident before step t (swap in, or recompute after ensuring its inputs, depth first with
        an explicit stack: no recursion limit); False if impossible."""
        stack: list[tuple[int, set[int], set[int] | None]] = [(u, protected, None)]
        while stack:
            self._tick()
            v, prot, inner = stack[-1]
            if inner is not None:  # every input of v is resident (and protected): compute v
                stack.pop()
                op = self.p.ops[v]
                if not self.make_room(op.bytes + op.workspace, inner, t):
                    return False
                self._bring("compute", v)
                continue
            if v in self.resident:
                stack.pop()
                continue
            swap = self.p.transfer_time(v) if (v in self.host and self.can_swap(v)) else INF
            rc = INF
            if self.can_recompute(v):  # its exact cost matters only beside a swap-in (else: an input that
                # cannot be restored fails below, as it would here)
                rc = self.p.ops[v].time + (sum(self.restore_cost(w) for w in self.p.inputs[v]) if swap < INF else 0.0)
            if swap == INF and rc == INF:
                return False
            if swap <= rc:
                stack.pop()
                if not self.make_room(self.p.ops[v].bytes, prot, t):
                    return False
                self._bring("swap_in", v)
                continue
            inner = prot | {v, *self.p.inputs[v]}
            stack[-1] = (v, prot, inner)
            stack.extend((w, inner, None) for w in reversed(self.p.inputs[v]))
        return True

    def step(self, i: int) -> bool:
        """Bring i's inputs in, make room, compute i (first time) and free what is dead."""
        protected = {i, *self.p.inputs[i]}
        for w in self.p.inputs[i]:
            if not self.ensure(w, protected, i):
                return False
        op = self.p.ops[i]
        if not self.make_room(op.bytes + op.workspace, protected, i):
            return False
        self._bring("compute", i)
        for u in {*self.p.inputs[i], *self.touched}:
            if u in self.resident and self.p.next_use(u, i + 1) is None:
                self.free(u)
        self.touched = []
        return True

    def finish(self) -> bool:
        """Make every keep op resident at the end."""
        keep = set(self.p.keep_idx)
        return all(self.ensure(k, keep, self.p.n) for k in sorted(keep))

    def run(self, after_step: Callable[[Simulator, int], None] | None = None) -> Events | None:
        """Simulate the whole program; the events, or None if the cap cannot be met (or the deadline passed).
        ``after_step(sim, i)`` runs after step i, except between a kernel and its further outputs."""
        if self.cap is None and after_step is None:
            self.deadline = dl.NEVER
        try:
            for i in range(self.p.n):
                self.deadline.check()
                if not self.step(i):
                    return None
                if after_step is not None and (i + 1 == self.p.n or self.p.ops[i + 1].of is None):
                    after_step(self, i)  # not between a kernel and its further outputs: taken at once
            return self.events if self.finish() else None
        except (dl.OutOfTime, _OverTimeCap):
            return None


def guided(problem: Problem, budget_bytes: int, evict: frozenset[tuple[int, int]], *,
           stop_at: float | None = None) -> Events | None:
    """Evict after each step the tensors whose gap to their next reader a relaxation chose not to
    keep (see bounds.relaxation_bound); cost-based eviction remains as the fallback under the cap."""

    def follow(sim: Simulator, i: int) -> None:
        for u in sorted(sim.resident):
            nu = problem.next_use(u, i + 1)
            if nu is not None and (u, nu) in evict and sim.evict_cost(u, i + 1)[0] < INF:
                sim.evict(u, i + 1)

    return Simulator(problem, budget_bytes, policy="cost", limits=Limits(stop_at)).run(after_step=follow)


def greedy(problem: Problem, budget_bytes: int, *, allow_swap: bool = True, allow_recompute: bool = True,
           policy: str = "belady", limits: Limits = Limits()) -> Events | None:
    """One greedy run under ``budget_bytes``; None if it could not stay under the cap (or was abandoned at one of
    its ``limits``)."""
    return Simulator(problem, budget_bytes, allow_swap=allow_swap, allow_recompute=allow_recompute,
                     policy=policy, limits=limits).run()
