"""A DTR-style static eviction plan for wide DAGs (Kirisame et al., "Dynamic Tensor Rematerialization",
ICLR 2021), replayed into the event format, and improved by ruin and recreate.

DTR evicts the resident tensor with the least h(t) = e*(t) / (size(t) x staleness(t)), e* being the
cost of rematerialising t with its evicted neighbourhood. A static schedule knows the program, so this
planner works on the plain program order's live intervals instead of a clock: each tensor's life is cut
into gaps between consecutive first-compute readers, and a gap is evicted: the tensor is freed after the
gap's first reader and restored by a swap-in (plus its first swap-out) or by recomputing it with the
ancestors that are not on the device then (at most MAX_CHAIN ops, each freed after its last reader there).
Plans of a second kind may instead hold an input of such a chain past its last reader, until the restore that
reads it, where the bytes held fit outside the evicted gap and are fewer than the evicted tensor's inside it
(CP-SAT's schedules on tight budgets keep small inputs so to make a recompute one op long).
The restore comes just before the next reader, or earlier, right after the last step of the gap still over
the budget or right after the step being relieved, where fewer ancestors are gone (a late restore relieves
more steps, an early one costs less). While some first compute is over the budget, the gap and restore step
with the least cost / (size x over-budget steps relieved) among the tensors live there is evicted: DTR's
score with staleness read as the stretch of over-budget steps the eviction relieves. Gaps later evictions
made unnecessary are kept again. :func:`refine_plan` then ruins and recreates parts of the plan. The plan's
events keep a recomputed ancestor for the next restore that needs it where it fits
(:func:`trainplan.schedule.retain.retain_recomputes`) and are replayed (trainplan.schedule.replay decides
validity and peak). Every loop checks the call's deadline; ruin and recreate also stops after a fixed amount
of work (:attr:`_Plan.work`), the same on any machine. A plan keeps each restore's walk over the missing
ancestors and uses it again while nothing it looked at changed residency (most candidates are asked about
again in later rounds): the same plans, about twice as fast on 1000-2000 ops.
"""

from __future__ import annotations

import copy
import heapq
import math
import random
import time
from dataclasses import dataclass
from typing import NamedTuple

from trainplan.schedule import deadline as dl
from trainplan.schedule.heuristic import INF, Events
from trainplan.schedule.problem import Problem
from trainplan.schedule.replay import ScheduleError, replay, take_outputs_at_once
from trainplan.schedule.retain import retain_recomputes


RAISE_DIV = 8  # :func:`raised_plan` raises its budget by 1/RAISE_DIV of a stuck step's excess (measured on the
# 500-2000-op layered DAGs: 1/2 reached 0.01-0.03 of the plain peak higher, 1/8 the budgets of fixed steps of 2%
# within 0.007 of the plain peak, in 0.44-0.69 of their work)
MAX_CHAIN = 30  # at most this many ops recomputed to restore one gap (the tensor and missing ancestors)
RESTART_NOISE = 0.5  # a restart multiplies each score by a uniform factor in [1, 1 + this]
RUIN_GAPS = 4  # a ruin-and-recreate move keeps again at most this many evicted gaps
REFINE_IDLE = 200  # ruin and recreate ends after this many moves in a row without a gain
# work units: an input looked at while building a chain is 1 (charged again when a kept walk is used); these are
# the others. Measured 2026-11-28 on 100-2000-op layered DAGs at 70-80% (1e7-addition loop 0.94 s): plans 2.2-4.8M
# units per second, ruin and recreate 2.4-4.2M (1.5-3.0M and 1.1-2.7M before walks were kept)
CANDIDATE_WORK = 10  # a (gap, restore step) candidate scored while relieving
THIN_WORK = 2  # a step looked at while thinning or checking that a restore's holds fit
COPY_WORK = 25  # an op's tables copied
SHIFT_WORK = 25  # a step's excess updated when a gap is evicted or kept


class _Counter:
    """Fenwick tree over steps: how many steps in a range are still over the budget."""

    def __init__(self, flags: list[bool]) -> None:
        self.tree = [0] * (len(flags) + 1)
        for i, f in enumerate(flags):
            if f:
                self.add(i, 1)

    def add(self, i: int, v: int) -> None:
        i += 1
        while i < len(self.tree):
            self.tree[i] += v
            i += i & -i

    def last_before(self, i: int) -> int:
        """The last flagged step before i (-1 if none), by one descent of the tree."""
        rank = self.prefix(i)
        if rank == 0:
            return -1
        pos, step = 0, 1 << (len(self.tree).bit_length() - 1)
        while step:  # the largest pos with prefix(pos) < rank: the flag counted rank-th is at step pos
            if pos + step < len(self.tree) and self.tree[pos + step] < rank:
                pos += step
                rank -= self.tree[pos]
            step >>= 1
        return pos

    def prefix(self, i: int) -> int:
        """Flags set in steps [0, i)."""
        total = 0
        while i > 0:
            total += self.tree[i]
            i -= i & -i
        return total


class _Gaps:
    """The plain order's gaps: for tensor u, consecutive stops (its compute, its readers, n for a keep op)."""

    def __init__(self, p: Problem) -> None:
        self.stops = [[u, *p.users[u]] + ([p.n] if u in p.keep_idx else []) for u in range(p.n)]
        self.last = [s[-1] for s in self.stops]  # u is alive in the plain order through step last[u]

    def covering(self, u: int, step: int) -> int | None:
        """Index k of u's gap (stops[k], stops[k+1]) whose interior holds ``step``; None if none does."""
        s = self.stops[u]
        lo, hi = 0, len(s) - 1
        if not (s[0] < step < s[-1]):
            return None
        while hi - lo > 1:  # s[lo] < step < s[hi]
            mid = (lo + hi) // 2
            if s[mid] < step:
                lo = mid
            elif s[mid] > step:
                hi = mid
            else:
                return None
        return lo


def plain_memory(p: Problem, stop: dl.Deadline = dl.NEVER) -> tuple[list[int], list[list[int]]]:
    """Bytes on the device at each first compute of the plain order (fixed + live + output + workspace)
    and the tensors live (resident, not being computed) there."""
    delta = [0] * (p.n + 2)
    live_at: list[list[int]] = [[] for _ in range(p.n)]
    gaps = _Gaps(p)
    for u in range(p.n):
        stop.check()
        end = min(gaps.last[u], p.n - 1)
        for s in range(u + 1, end + 1):
            live_at[s].append(u)
        delta[u + 1] += p.ops[u].bytes
        delta[end + 1] -= p.ops[u].bytes
    mem, run = [], 0
    for s in range(p.n):
        run += delta[s]
        mem.append(p.fixed_bytes + run + p.ops[s].bytes + p.ops[s].workspace)
    return mem, live_at


@dataclass(frozen=True)
class Effort:
    """What ends making plans, and what they did: ``stop``, a deadline (None: the call's), and ``meter``, a counter
    the plans add their work units to (:attr:`_Plan.work`; None: a fresh one), past ``work_cap`` units."""

    stop: dl.Deadline | None = None
    meter: list[int] | None = None
    work_cap: float = INF

    def started(self) -> Effort:
        """This effort with the call's deadline for no ``stop`` and a fresh counter for no ``meter``."""
        return Effort(dl.current() if self.stop is None else self.stop, [0] if self.meter is None else self.meter,
                      self.work_cap)


@dataclass(frozen=True)
class DtrOptions:
    """Which plans :func:`dtr_plan` makes: swap-ins allowed (``allow_swap``), randomised ``restarts`` drawn with
    ``seed``, both kinds of plans or only those that hold no input past its last reader (``holds`` false), and ruin
    and recreate on the kept plan for at most ``refine`` work units and ``refine_wall_s`` wall seconds."""

    allow_swap: bool = True
    restarts: int = 0
    seed: int = 0
    refine: int = 0
    refine_wall_s: float | None = None
    holds: bool = True


@dataclass(frozen=True)
class _Rules:
    """How a plan evicts and restores: swap-ins allowed (``allow_swap``), chains of at most ``max_chain``
    recomputes, restores before the next reader (``early``, :meth:`_Plan.restore_steps`), inputs held past their
    last reader (``hold``, :meth:`_Plan.chain`)."""

    allow_swap: bool
    max_chain: int
    early: bool
    hold: bool = False


def dtr_plan(problem: Problem, budget_bytes: int, options: DtrOptions = DtrOptions(), effort: Effort = Effort(),
             found: list[float] | None = None) -> Events | None:
    """Events of the eviction plan under ``budget_bytes`` (module docstring), or None if none is found (or
    the deadline passed). Plans of two kinds are made, holding inputs past their last reader
    (:meth:`_Plan.chain`) and not (``options.holds`` false: only the latter, which fail sooner where no plan
    exists), with chains of at most MAX_CHAIN recomputes, each kind restoring late and early, and the restarts
    shared between the kinds (:class:`_Kind`: restarts have their scores perturbed by up to RESTART_NOISE, seeded:
    the same plans on any machine, unless the deadline cuts them short); the cheapest replay-valid plan is kept.
    Where no such plan fits, plans with chains of any length (slower: tight budgets on wide DAGs, where earlier
    evictions leave long chains of missing ancestors), those that hold inputs first, until one kind finds a
    plan; these restore late first, and only late once that fits. Late plans come first everywhere: where no
    plan fits they fail sooner, so a tight budget reaches the fallback's late plan before the early plans.
    ``options.refine``: ruin and recreate on the kept plan for at most that much work (:func:`refine_plan`), and
    at most ``options.refine_wall_s`` wall seconds from its start (a safety net; the deadline always ends it).
    ``effort``: the deadline, and the meter the plans add their work units to; making plans stops once it passes
    its work cap. ``found``: gets the ``time.perf_counter()`` at which the first valid plan was ready (the deadline
    passing then would have returned it; the plans after it may be cheaper)."""
    search = _Search(problem, budget_bytes, options.allow_swap, effort, found)
    kinds = (False, True) if options.holds else (False,)
    each = options.restarts // len(kinds)
    seed = options.seed
    bounded = [_Kind(MAX_CHAIN, hold, seed) for hold in kinds] if MAX_CHAIN < problem.n else []
    fallback = [_Kind(problem.n, hold, seed, late_only=True) for hold in reversed(kinds)]
    try:
        # late plans first: on the 2000-op layered DAG at 70% (recompute only) the bounded late plans failed in
        # 0.19 and 0.57 s, the early ones in 1.03 and 1.83 s, and the fallback's late plan fitted in 1.49 s
        for kind in bounded:
            search.make(kind, early=False)
        if not any(kind.best for kind in bounded):
            search.make(fallback[0], early=False)
        for kind in bounded:
            search.rest(kind, each)
        if not any(kind.best for kind in bounded):
            for kind in fallback:
                search.rest(kind, each)
                if kind.best is not None:
                    break
    except dl.OutOfTime:
        pass
    best = min((kind.best for kind in bounded + fallback if kind.best is not None), key=lambda b: b[0], default=None)
    if best is None:
        return None
    if options.refine:
        wall_s = options.refine_wall_s
        refine_stop = search.stop.earlier(None if wall_s is None else time.perf_counter() + wall_s)
        best = refine_plan(best[1], best[0], options.refine, random.Random(seed), refine_stop)
    return best[1].events()


def raised_plan(problem: Problem, budget_bytes: int, least_raise: int, ceiling: int, *, allow_swap: bool = True,
                effort: Effort = Effort()) -> Events | None:
    """Events of one plan that starts at ``budget_bytes`` and, where a step cannot be relieved, raises its budget
    by 1/RAISE_DIV of that step's excess (at least ``least_raise`` bytes) instead of failing: a schedule near the
    least budget this planner reaches, in about the work of one plan, for a bisection's upper end. The plan
    restores late with chains of at most MAX_CHAIN that hold inputs, the kind that reached the least budgets on
    the layered DAGs. Out of work (``effort`` as in :func:`dtr_plan`), the plan so far, at the budget its worst
    step needs. None past the deadline or once the budget would pass ``ceiling``."""
    effort = effort.started()
    stop = effort.stop
    try:
        plan = _Plan(problem, budget_bytes, _Rules(allow_swap, MAX_CHAIN, early=False, hold=True), effort,
                     least_raise=max(1, least_raise), ceiling=ceiling)
    except dl.OutOfTime:
        return None
    try:
        if not plan.relieve(None):
            return None
        plan.thin()
    except dl.OutOfTime:
        if stop.passed():
            return None
        need = max(0, *(max(e, plan.restoring(t)) for t, e in enumerate(plan.excess)))
        if plan.budget + need > ceiling:
            return None
        plan.raise_budget(need)
    return plan.events() if plan.time() is not None else None


class _Kind:
    """The plans of one kind: chains of at most ``max_chain`` recomputes, holding inputs past their last reader
    or not. Its first two plans restore late and early, unperturbed (with no restarts, the early one only if the
    late one fails); restarts follow, numbered from 2, early on even numbers (``late_only``: on odd ones, and
    none once the late plan fits), none if neither first plan fits. Each kind draws its perturbations from its
    own seeded generator: the same plans whatever order the kinds are made in."""

    def __init__(self, max_chain: int, hold: bool, seed: int, late_only: bool = False) -> None:
        self.max_chain, self.hold, self.late_only = max_chain, hold, late_only
        self.rng = random.Random(seed)
        self.late_fits: bool | None = None  # None until the late plan is made
        self.best: tuple[float, _Plan] | None = None  # the cheapest plan that fits, and its replayed time


class _Search:
    """The plans :func:`dtr_plan` makes, under one deadline and work cap; the time the first valid one was ready is
    stamped in ``found``."""

    def __init__(self, problem: Problem, budget: int, allow_swap: bool, effort: Effort,
                 found: list[float] | None) -> None:
        self.problem, self.budget, self.allow_swap, self.found = problem, budget, allow_swap, found
        self.effort = effort.started()  # one deadline and meter for every plan
        self.stop = self.effort.stop

    def make(self, kind: _Kind, early: bool, perturbed: bool = False) -> None:
        """One plan of ``kind``, kept as its best if it fits and is cheaper; OutOfTime past the deadline or the
        work cap."""
        if self.stop.passed() or self.effort.meter[0] > self.effort.work_cap:
            raise dl.OutOfTime
        plan = _plan(self.problem, self.budget, _Rules(self.allow_swap, kind.max_chain, early, kind.hold), self.effort,
                     kind.rng if perturbed else None)
        t = None if plan is None else plan.time()
        if not early and not perturbed:
            kind.late_fits = t is not None
        if t is not None and self.found is not None and not self.found:
            self.found.append(time.perf_counter())
        if t is not None and (kind.best is None or t < kind.best[0]):
            kind.best = (t, plan)

    def rest(self, kind: _Kind, restarts: int) -> None:
        """The plans of ``kind`` after its late one (made first if it was not): the early one, then the
        ``restarts`` - 1 perturbed ones (see :class:`_Kind`)."""
        if kind.late_fits is None:
            self.make(kind, early=False)
        if not kind.late_fits or (restarts and not kind.late_only):
            self.make(kind, early=True)
        if kind.best is None:
            return
        for attempt in range(2, 1 + restarts):
            early = attempt % 2 == kind.late_only
            if not (early and kind.late_only and kind.late_fits):
                self.make(kind, early=early, perturbed=True)


def refine_plan(plan: _Plan, plan_time: float, work: int, rng: random.Random,
                stop: dl.Deadline) -> tuple[float, _Plan]:
    """Ruin and recreate (Schrimpf et al. 2000) on an eviction plan until it has done ``work`` (its
    :attr:`_Plan.work` units: deterministic) or ``stop`` passes (a safety net): keep
    again a random evicted gap and up to RUIN_GAPS - 1 others evicted over the same steps, relieve the steps
    over the budget again with perturbed scores (the first gap not evicted again), thin; the new plan
    replaces the old one if its replayed time is no higher; ends after REFINE_IDLE moves in a row without a
    gain. ``plan_time``: the plan's replayed time. The best plan's replayed time and the plan."""
    best, best_t = plan, plan_time
    idle, end = 0, plan.work[0] + work
    while plan.work[0] < end:  # copies share the meter
        if stop.passed() or not best.paid or idle >= REFINE_IDLE:
            break
        idle += 1
        gaps = sorted(best.paid)
        seed_gap = rng.choice(gaps)
        a, c = best.gaps.stops[seed_gap[0]][seed_gap[1]], best.evicted[seed_gap[0]][seed_gap[1]]
        near = [g for g in gaps if g != seed_gap
                and best.gaps.stops[g[0]][g[1]] < c and best.evicted[g[0]][g[1]] > a]
        ruin = [seed_gap, *rng.sample(near, min(len(near), rng.randint(0, RUIN_GAPS - 1)))]
        cand = best.copy()
        cand.stop = stop
        for u, k in ruin:
            cand.keep(u, k)
        try:
            if not cand.relieve(rng, banned=frozenset([seed_gap])):
                continue
            cand.thin()
        except dl.OutOfTime:
            break
        t = cand.time()
        if t is not None and t <= best_t:
            idle = 0 if t < best_t else idle
            best, best_t = cand, t
    return best_t, best


class _Walk(NamedTuple):
    """A walk over the ancestors a restore recomputes (:meth:`_Plan.chain`): what it found, valid while each
    tensor in ``seen`` is still read (``read``) or recomputed as then (checked for those changed after ``epoch``)."""

    epoch: int
    seen: tuple[int, ...]  # the inputs looked at, in order (repeats included)
    read: tuple[bool, ...]  # whether each was on the device (read) rather than recomputed
    end: str  # why the walk stopped early: "fixed" (an ancestor cannot be recomputed), "long", "cap"; "" if not
    cap: float  # the cost it was pruned at
    spent: float  # its running sum of op times
    work: int  # work units the walk took (charged again each time it is used)
    time: float  # the chain's op time (complete walks)
    order: list[int]  # the chain, in program order
    reads: set[int]  # the resident tensors it reads
    peak: int  # chain_peak of ``order`` (complete walks)


class _Plan:
    """One eviction plan under construction: the plain order's memory less the evicted gaps, and per evicted
    gap how it is restored. Gaps are evicted and kept again (``evict``/``keep``) with every derived table
    updated, so a plan can be relieved, thinned and partly undone (:func:`refine_plan`)."""

    def __init__(self, p: Problem, budget: int, rules: _Rules, effort: Effort = Effort(), least_raise: int = 0,
                 ceiling: float = INF) -> None:
        """``effort``: its deadline (default: the call's) and meter (default: the plan's own) are the plan's."""
        effort = effort.started()
        self.p, self.budget, self.allow_swap, self.stop = p, budget, rules.allow_swap, effort.stop
        self.max_chain = rules.max_chain
        self.hold = rules.hold  # a restore's chain may keep an input alive past its last reader (:meth:`chain`)
        self.early = rules.early  # restores may come before the next reader (:meth:`restore_steps`)
        self.gaps = _Gaps(p)
        mem, self.live_at = plain_memory(p, self.stop)
        self.excess = [m - budget for m in mem]
        self.evicted: list[dict[int, int]] = [{} for _ in range(p.n)]  # per tensor: evicted gap -> restore step
        self.swaps = [0] * p.n  # gaps of u restored by swap-in (after the first, a swap-in costs one transfer)
        self.by_swap: dict[tuple[int, int], bool] = {}
        self.needs_at: list[list[int]] = [[] for _ in range(p.n)]  # steps where u must be resident to recompute
        # (past u's last reader too, when a chain holds u: :meth:`held_until`)
        self.chains: dict[tuple[int, int], list[int]] = {}  # ops recomputed (in order) to restore a gap
        self.reads: dict[tuple[int, int], set[int]] = {}  # the resident tensors a gap's chain reads
        self.paid: dict[tuple[int, int], float] = {}  # each evicted gap's restore cost
        self.extra: dict[tuple[int, int], int] = {}  # bytes of a restore's missing ancestors, held at its step
        self.transient = [0] * p.n  # peak bytes of the recomputes before step s beyond the restored tensors
        self.base = [op.bytes + op.workspace for op in p.ops]  # a compute's own bytes (output, workspace)
        self.counter = _Counter([e > 0 for e in self.excess])
        self.work = effort.meter  # work units done (CANDIDATE_WORK...): shared by copies
        self.work_cap = effort.work_cap  # relieve and thin stop (OutOfTime) once the meter passes it
        self.walks: dict[tuple[int, int, bool], _Walk] = {}  # chain walks kept (:meth:`chain`)
        self.clock = [0]  # residency changes made so far, by this plan and its copies (shared, so epochs are unique)
        self.changed = [0] * p.n  # the clock when each tensor's residency last changed
        self.polished: Events | None = None  # :meth:`events` until the plan next changes (evict, keep)
        self.least_raise = least_raise  # > 0: relieve raises the budget where a step is stuck (:func:`raised_plan`)
        self.ceiling = ceiling  # ... but not past this

    def copy(self) -> _Plan:
        """An independent copy (the problem and the plain order's tables are shared)."""
        new = copy.copy(self)
        self.work[0] += COPY_WORK * self.p.n
        new.excess, new.swaps, new.transient = list(self.excess), list(self.swaps), list(self.transient)
        new.evicted = [dict(e) for e in self.evicted]
        new.needs_at = [list(s) for s in self.needs_at]
        new.by_swap, new.chains, new.reads = dict(self.by_swap), dict(self.chains), dict(self.reads)
        new.paid, new.extra = dict(self.paid), dict(self.extra)
        new.counter = copy.copy(self.counter)
        new.counter.tree = list(self.counter.tree)
        new.walks, new.changed = dict(self.walks), list(self.changed)
        return new

    def check(self) -> None:
        """Raise OutOfTime past the deadline or the work cap."""
        self.stop.check()
        if self.work[0] > self.work_cap:
            raise dl.OutOfTime

    def restoring(self, s: int) -> int:
        """Excess bytes while step s's restores run: what stays resident before its compute and the peak of
        the recomputes that restore (ancestors freed after their last reader there)."""
        return self.excess[s] - self.base[s] + self.transient[s]

    def resident_at(self, w: int, step: int) -> bool:
        """w is on the device at ``step`` under the plan (before any restore there)."""
        if w >= step:
            return False
        if self.gaps.last[w] < step:  # past its last reader: only a plan that holds inputs keeps it
            return self.hold and step <= self.held_until(w)
        evicted = self.evicted[w]
        if not evicted:
            return True
        stops = self.gaps.stops[w]  # off the device inside an evicted gap, until its restore step
        return not any(stops[k] < step <= c and step < stops[k + 1] for k, c in evicted.items())

    def held_until(self, w: int) -> int:
        """The last step w is on the device through, its last reader's or a later restore's that reads it."""
        return max(self.gaps.last[w], *self.needs_at[w]) if self.needs_at[w] else self.gaps.last[w]

    def chain(self, u: int, b: int, cap: float = INF,
              hold: bool = False) -> _Walk | None:
        """Recomputing u just before step b: the walk over u's ancestors that are not on the device then
        (:class:`_Walk`: their and u's op time, the chain in program order, the resident tensors it reads,
        its peak beyond u); None if an ancestor cannot be recomputed, the chain exceeds ``max_chain`` ops or
        costs more than ``cap``, or its ancestors' bytes (held while step b's restores run, freed before its
        compute) need more room than that compute. ``hold``: an input whose life ended before b is read
        instead, kept on the device until b's compute (:meth:`_holds_fit` says whether that fits). The walk is
        kept and used again while the residency of every tensor it looked at is unchanged."""
        capx = cap * (1 + 1e-9)  # a running sum: prune only what is surely dearer
        key = (u, b, hold)
        walk = self.walks.get(key)
        if walk is None or (walk.end == "cap" and capx > walk.cap) or not self._still(walk, b, hold):
            walk = self._walk(u, b, capx, hold)
            self.walks[key] = walk
        elif walk.epoch < self.clock[0]:
            self.walks[key] = walk._replace(epoch=self.clock[0])
        self.work[0] += walk.work
        if walk.end or walk.spent > capx:
            return None
        # the ancestors are freed before step b's compute: they may use the room that compute needs, never more
        if self.restoring(b) + walk.peak > max(self.excess[b], 0):
            return None
        return walk

    def _resident_or_held(self, w: int, b: int, hold: bool) -> bool:
        """A chain restoring at b reads w rather than recomputing it (:meth:`chain`)."""
        return self.resident_at(w, b) or (hold and self.gaps.last[w] < b)

    def _still(self, walk: _Walk, b: int, hold: bool) -> bool:
        """Whether every tensor ``walk`` looked at is still read or recomputed as it found."""
        changed, epoch = self.changed, walk.epoch
        return all(changed[w] <= epoch or self._resident_or_held(w, b, hold) == read
                   for w, read in zip(walk.seen, walk.read))

    def _walk(self, u: int, b: int, capx: float, hold: bool) -> _Walk:
        """The ancestors of u a restore at b recomputes (:meth:`chain`), walked until ``max_chain`` ops or
        ``capx`` seconds are passed."""
        p, last, evicted, stops, needs_at = self.p, self.gaps.last, self.evicted, self.gaps.stops, self.needs_at
        members, reads, todo = {u}, set(), [u]
        seen: list[int] = []
        read: list[bool] = []
        spent, work, end = p.ops[u].time, 0, ""
        while todo and not end:
            v = todo.pop()
            if not p.ops[v].recompute:
                end = "fixed"
                break
            work += len(p.inputs[v]) + 1
            for w in p.inputs[v]:  # _resident_or_held(w, b, hold) inlined (20% of a plan's time; inputs precede b)
                if last[w] < b:  # past its last reader: read if held (hold), or kept for a later restore
                    found = hold or (self.hold and bool(needs_at[w]) and b <= max(needs_at[w]))
                else:
                    gone, st = evicted[w], stops[w]
                    found = not gone or not any(st[k] < b <= c and b < st[k + 1] for k, c in gone.items())
                seen.append(w)
                read.append(found)
                if found:
                    reads.add(w)
                elif w not in members:
                    members.add(w)
                    todo.append(w)
                    spent += p.ops[w].time
                    if len(members) > self.max_chain:
                        end = "long"
                        break
                    if spent > capx:
                        end = "cap"
                        break
        order = sorted(members)
        return _Walk(self.clock[0], tuple(seen), tuple(read), end, capx, spent, work,
                     0.0 if end else math.fsum(p.ops[w].time for w in members), order, reads,
                     0 if end else chain_peak(p, order))

    def cost(self, u: int, k: int, c: int, cap: float = INF) -> tuple[float, bool, bool]:
        """Cheapest restore of u's gap k at step ``c`` (its cost, whether by swap-in, whether its chain holds
        inputs past their last reader); INF if none costs at most ``cap``."""
        p = self.p
        a, b = self.gaps.stops[u][k], self.gaps.stops[u][k + 1]
        if any(a < s < c for s in self.needs_at[u]):  # a reader's recompute needs u before the restore
            return INF, False, False
        if b >= p.n:  # a keep op's last stretch: it must be on the device at the end
            return INF, False, False
        found, held = None, False
        if self.hold:
            found = self.chain(u, c, cap, hold=True)
            held = found is not None and self._holds_fit(u, k, c, found)
        if not held:
            found = self.chain(u, c, cap)
        rc = INF if found is None else found.time
        sw = INF
        if self.allow_swap and p.ops[u].swap:
            sw = p.transfer_time(u) * (1 if self.swaps[u] else 2)
        return (sw, True, False) if sw < rc else (rc, False, held)

    def _holds_fit(self, u: int, k: int, c: int, walk: _Walk) -> bool:
        """Whether holding the reads of ``walk`` whose life ended before c until c's compute, while u's gap k is
        evicted until c and restored there by recomputing the walk's chain, frees bytes on every step inside
        the gap and leaves every other step it touches, and c's restores, within the budget."""
        p, a, size = self.p, self.gaps.stops[u][k], self.p.ops[u].bytes
        starts = sorted((end + 1, p.ops[w].bytes) for w in walk.reads if (end := self.held_until(w)) < c)
        if not starts:
            return True
        first = starts[0][0]
        fail = self._first_unfit(starts, a, c, size)
        # the steps are looked at in order until one does not fit
        self.work[0] += THIN_WORK * ((c if fail is None else fail) - first + 1)
        return fail is None and self.restoring(c) + sum(b for _, b in starts) + walk.peak <= 0

    def _first_unfit(self, starts: list[tuple[int, int]], a: int, c: int, size: int) -> int | None:
        """The first step from ``starts[0]`` to c where bytes held from the (sorted) ``starts`` on do not fit:
        inside u's gap (a, c) they must be fewer than u's ``size``, elsewhere fit beside the step's excess and
        its restores (:meth:`restoring`); None if every step fits."""
        excess, transient, base = self.excess, self.transient, self.base
        held, i, t = 0, 0, starts[0][0]
        while t <= c:
            while i < len(starts) and starts[i][0] <= t:
                held += starts[i][1]
                i += 1
            nxt = starts[i][0] if i < len(starts) else c + 1  # held is constant on [t, nxt)
            if a < t < c:  # inside the gap held only grows: its first step decides the stretch
                if held >= size:
                    return t
                t = min(nxt, c)
                continue
            hi = min(nxt, a + 1 if t <= a else c + 1)
            for s in range(t, hi):
                if excess[s] + max(0, transient[s] - base[s]) + held > 0:  # max(excess, restoring) + held
                    return s
            t = hi
        return None

    def restore_steps(self, u: int, k: int, s: int) -> list[int]:
        """Where u's gap k, which holds the over-budget step s, may be restored: before its next reader, or
        earlier (when fewer of its ancestors are gone) right after the last step of the gap still over the
        budget, or right after s."""
        b = self.gaps.stops[u][k + 1]
        steps = [b]
        if not self.early:
            return steps
        last = self.last_over(b)
        for c in (last + 1, s + 1):
            if s < c < b and c not in steps:
                steps.append(c)
        return steps

    def raise_budget(self, by: int) -> None:
        """Raise the plan's budget by ``by`` bytes (every step's excess drops by as much)."""
        self.polished = None
        self.budget += by
        self.work[0] += SHIFT_WORK * self.p.n
        self._add(0, self.p.n, -by)

    def last_over(self, b: int) -> int:
        """The last step before b over the budget (-1 if none)."""
        return self.counter.last_before(b)

    def _shift(self, u: int, k: int, sign: int) -> None:
        """Add (sign -1: evicted) or give back (+1) u's bytes on the steps where its gap k is evicted."""
        a, c = self.gaps.stops[u][k], self.evicted[u][k]
        self.work[0] += SHIFT_WORK * (c - a)
        self._moved(u)
        self._add(a + 1, min(c, self.p.n), sign * self.p.ops[u].bytes)

    def _add(self, lo: int, hi: int, size: int) -> None:
        """Add ``size`` bytes to the excess of steps [lo, hi), keeping the over-budget counter in step."""
        for t in range(lo, hi):
            before = self.excess[t] > 0
            self.excess[t] += size
            if before != (self.excess[t] > 0):
                self.counter.add(t, 1 if self.excess[t] > 0 else -1)

    def evict(self, u: int, k: int, c: int) -> None:
        """Evict u's gap k until step ``c``, restored there the cheapest way (its cost must be finite)."""
        self.polished = None
        cost, sw, held = self.cost(u, k, c)
        if sw:
            c = self.gaps.stops[u][k + 1]  # a swap-in costs the same anywhere: as late as possible
        self.paid[(u, k)] = cost
        self.evicted[u][k] = c
        self.by_swap[(u, k)] = sw
        self.swaps[u] += sw
        if not sw:
            b = c
            found = self.chain(u, b, hold=held)
            assert found is not None
            self.chains[(u, k)], self.reads[(u, k)] = found.order, found.reads
            for w in found.reads:
                self._need(w, b, +1)
            self.extra[(u, k)] = found.peak
            self.transient[b] += self.extra[(u, k)]  # held while restoring, freed before b's compute
        self._shift(u, k, -1)

    def _moved(self, w: int) -> None:
        """Note that w's residency changed on some steps (the chain walks that looked at w are checked again)."""
        self.clock[0] += 1
        self.changed[w] = self.clock[0]

    def _need(self, w: int, b: int, sign: int) -> None:
        """Add (sign +1) or drop (-1) a restore at step b that reads w, with w's bytes on the steps past its
        last reader it is then held through."""
        before = self.held_until(w)
        if sign > 0:
            self.needs_at[w].append(b)
        else:
            self.needs_at[w].remove(b)
        after = self.held_until(w)
        self.work[0] += SHIFT_WORK * abs(after - before)
        if after != before:
            self._moved(w)
        self._add(min(before, after) + 1, max(before, after) + 1, self.p.ops[w].bytes * (1 if after > before else -1))

    def keep(self, u: int, k: int) -> None:
        """Keep u's evicted gap k on the device again."""
        self.polished = None
        b = self.evicted[u][k]
        self._shift(u, k, +1)
        del self.evicted[u][k]
        del self.paid[(u, k)]
        self.swaps[u] -= self.by_swap.pop((u, k))
        if (u, k) in self.chains:
            del self.chains[(u, k)]
            for w in self.reads.pop((u, k)):
                self._need(w, b, -1)
            self.transient[b] -= self.extra.pop((u, k))

    def relieve(self, rng: random.Random | None, banned: frozenset[tuple[int, int]] = frozenset()) -> bool:
        """Evict gaps until no first compute is over the budget, worst step first, each time the gap with the
        least cost / (size x over-budget steps it spans) among those live there (``rng``: scores perturbed by
        up to RESTART_NOISE; ``banned`` gaps are not evicted); False if some step cannot be relieved."""
        p, excess = self.p, self.excess
        heap = [(-excess[s], s) for s in range(p.n) if excess[s] > 0]  # worst step first
        heapq.heapify(heap)
        while heap:
            self.check()
            neg, s = heapq.heappop(heap)
            if excess[s] <= 0:
                continue
            if -neg != excess[s]:
                heapq.heappush(heap, (-excess[s], s))
                continue
            candidates = []  # (a lower bound on the score, weight, gap, restore step)
            for u in self.live_at[s]:
                k = self.gaps.covering(u, s)
                if k is None or k in self.evicted[u] or (u, k) in banned:
                    continue
                a = self.gaps.stops[u][k]
                noise = 1 + RESTART_NOISE * rng.random() if rng is not None else 1.0
                swap_in = p.transfer_time(u) if self.allow_swap and p.ops[u].swap else INF
                for c in self.restore_steps(u, k, s):
                    self.work[0] += CANDIDATE_WORK
                    # a restore costs at least u's compute and its inputs' that are gone then, or a swap-in
                    least = min(swap_in, p.ops[u].time + sum(
                        p.ops[w].time for w in p.inputs[u]
                        if not self.resident_at(w, c) and not (self.hold and self.gaps.last[w] < c)))
                    span = self.counter.prefix(min(c, p.n)) - self.counter.prefix(a + 1)
                    weight = noise / (max(1, p.ops[u].bytes) * span)
                    candidates.append((least * weight, weight, u, k, c))
            candidates.sort()
            best: tuple[float, int, int, int, int] | None = None
            for least, weight, u, k, c in candidates:
                if best is not None and least > best[0]:
                    break  # branch and bound: no candidate left can beat the best score so far
                self.check()
                cost, *_ = self.cost(u, k, c, INF if best is None else best[0] / weight)
                if cost == INF:
                    continue
                key = (cost * weight, -p.ops[u].bytes, u, k, c)
                if best is None or key < best:
                    best = key
            if best is None:  # nothing evictable relieves this step without a cascade
                if not self.least_raise:
                    return False
                by = max(self.least_raise, excess[s] // RAISE_DIV)
                if self.budget + by > self.ceiling:
                    return False
                self.raise_budget(by)
                if excess[s] > 0:
                    heapq.heappush(heap, (-excess[s], s))
                continue
            self.evict(best[2], best[3], best[4])
            if excess[s] > 0:
                heapq.heappush(heap, (-excess[s], s))
        return True

    def thin(self) -> None:
        """Keep again the gaps later evictions made unnecessary (every step they span has room), costliest first."""
        for (u, k), _ in sorted(self.paid.items(), key=lambda item: -item[1]):
            self.check()
            a, c = self.gaps.stops[u][k], self.evicted[u][k]
            size = self.p.ops[u].bytes
            self.work[0] += THIN_WORK * (c - a)
            if all(max(self.excess[t], self.restoring(t)) + size <= 0 for t in range(a + 1, min(c, self.p.n))):
                self.keep(u, k)

    def events(self) -> Events:
        """The plan as events (:func:`_events`), each recomputed ancestor kept for the next restore that needs
        it where it fits (:func:`retain_recomputes`); made once per state of the plan, so the events returned are
        those :meth:`time` measured, even once the deadline that would cut their polish has passed."""
        if self.polished is None:
            self.polished = self._polish()
        return self.polished

    def _polish(self) -> Events:
        ends = [self.held_until(u) for u in range(self.p.n)]
        events = _events(self.p, self.gaps, self.evicted, self.by_swap, self.chains, ends)
        try:
            # the call's deadline, not the plan's (refine_plan's share may have passed when its best plan is read)
            return retain_recomputes(self.p, events, self.budget, dl.current())
        except ScheduleError:  # a plan refine_plan made can be invalid: time() says so
            return events

    def time(self) -> float | None:
        """The replayed time of :meth:`events`, or None if they break the budget (not expected, but checked)."""
        try:
            return replay(self.p, self.events(), self.budget).time
        except ScheduleError:
            return None


def _plan(p: Problem, budget: int, rules: _Rules, effort: Effort = Effort(),
          rng: random.Random | None = None) -> _Plan | None:
    """A relieved and thinned plan (``rng``: perturbed scores), or None if some step cannot be relieved."""
    plan = _Plan(p, budget, rules, effort)
    if not plan.relieve(rng):
        return None
    plan.thin()
    return plan


def chain_peak(p: Problem, members: list[int]) -> int:
    """Peak bytes beyond the restored tensor (the last member) of recomputing ``members`` in program order,
    each ancestor freed after its last reader among them, workspace included."""
    last = {w: v for v in members for w in p.inputs[v]}
    ancestors = set(members[:-1])
    held = peak = 0
    for v in members:
        own = 0 if v == members[-1] else p.ops[v].bytes
        peak = max(peak, held + own + p.ops[v].workspace)
        held += own
        held -= sum(p.ops[w].bytes for w in p.inputs[v] if w in ancestors and last[w] == v)
    return peak


def _events(p: Problem, gaps: _Gaps, evicted: list[dict[int, int]], by_swap: dict[tuple[int, int], bool],
            chains: dict[tuple[int, int], list[int]], ends: list[int] | None = None) -> Events:
    """The plan as events: restores before each first compute, frees after it (a tensor after its last
    reader, or after ``ends[u]`` where a restore holds it longer, or at the start of an evicted gap, swapped
    out first when the gap is restored by swap-in)."""
    restore_at: list[list[tuple[int, int]]] = [[] for _ in range(p.n + 1)]
    free_after: list[list[tuple[int, int]]] = [[] for _ in range(p.n)]
    for u in range(p.n):
        stops = gaps.stops[u]
        for k, c in evicted[u].items():
            free_after[stops[k]].append((u, k))
            restore_at[c].append((u, k))
        if u not in p.keep_idx:
            free_after[stops[-1] if ends is None else ends[u]].append((u, -1))
    events: Events = []
    on_host: set[int] = set()
    resident: set[int] = set()
    for s in range(p.n):
        owners = {u for u, _ in restore_at[s]}
        steps: list[tuple[str, int]] = []
        for u, k in sorted(restore_at[s]):  # inputs before readers (program order)
            if by_swap[(u, k)]:
                steps.append(("swap_in", u))
                resident.add(u)
                continue
            for v in chains[(u, k)]:
                if v not in resident:
                    steps.append(("compute", v))
                    resident.add(v)
        last = {w: i for i, (kind, v) in enumerate(steps) if kind == "compute" for w in p.inputs[v]}
        transient = {v for kind, v in steps if kind == "compute" and v not in owners}
        for i, (kind, v) in enumerate(steps):
            events.append((kind, p.ops[v].id))
            if kind == "compute" and v in transient and v not in last:
                last[v] = i  # never read here (a shared ancestor): gone at once
            for w in sorted(w for w in transient if last.get(w) == i):  # recomputed only to restore a gap
                events.append(("free", p.ops[w].id))
                resident.discard(w)
        events.append(("compute", p.ops[s].id))
        resident.add(s)
        for u, k in sorted(free_after[s]):
            if k >= 0 and by_swap[(u, k)] and u not in on_host:
                events.append(("swap_out", p.ops[u].id))
                on_host.add(u)
            events.append(("free", p.ops[u].id))
            resident.discard(u)
    return take_outputs_at_once(p, events)
