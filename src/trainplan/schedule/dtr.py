"""A DTR-style static eviction plan for wide DAGs (Kirisame et al., "Dynamic Tensor Rematerialization",
ICLR 2021), replayed into the event format.

DTR evicts the resident tensor with the least h(t) = e*(t) / (size(t) x staleness(t)), e* being the
cost of rematerialising t with its evicted neighbourhood. A static schedule knows the program, so this
planner works on the plain program order's live intervals instead of a clock: each tensor's life is cut
into gaps between consecutive first-compute readers, and a gap is evicted (the tensor freed after the
gap's first reader and restored just before the next) only where that restore costs exactly one op: a
recompute whose inputs are all resident then (alive in the plain order and not evicted across that
point), so e* = the op's time and no recompute cascades; or, where the op may swap, one swap-in (plus
the tensor's first swap-out). While some first compute is over the budget, the gap with the least
cost / (size x over-budget steps it spans) among the tensors live there is evicted: DTR's score with
staleness read as the stretch of over-budget steps the eviction relieves. The plan's events are then
replayed (trainplan.schedule.replay decides validity and peak). Every loop checks the call's deadline.
"""

from __future__ import annotations

import heapq
import math
import random

from trainplan.schedule import deadline as dl
from trainplan.schedule.heuristic import INF, Events
from trainplan.schedule.problem import Problem
from trainplan.schedule.replay import ScheduleError, replay, take_outputs_at_once


MAX_CHAIN = 30  # at most this many ops recomputed to restore one gap (the tensor and missing ancestors)
RESTART_NOISE = 0.5  # a restart multiplies each score by a uniform factor in [1, 1 + this]


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


def dtr_plan(problem: Problem, budget_bytes: int, *, allow_swap: bool = True, restarts: int = 0, seed: int = 0,
             stop: dl.Deadline | None = None) -> Events | None:
    """Events of the eviction plan under ``budget_bytes`` (module docstring), or None if none is found (or
    the deadline passed). ``restarts``: that many more plans with the scores perturbed by up to
    RESTART_NOISE (seeded: the same plans on any machine, unless the deadline cuts them short); the
    cheapest replay-valid plan is returned. If no plan restores every gap with at most MAX_CHAIN
    recomputes, one plan with chains of any length (slower: tight budgets on wide DAGs, where earlier
    evictions leave long chains of missing ancestors)."""
    stop = dl.current() if stop is None else stop
    best = _best_plan(problem, budget_bytes, allow_swap, restarts, seed, stop, MAX_CHAIN)
    if best is not None or MAX_CHAIN >= problem.n or stop.passed():
        return best
    return _best_plan(problem, budget_bytes, allow_swap, 0, seed, stop, problem.n)


def _best_plan(problem: Problem, budget_bytes: int, allow_swap: bool, restarts: int, seed: int,
               stop: dl.Deadline, max_chain: int) -> Events | None:
    """The cheapest replay-valid plan of 1 + ``restarts`` with chains of at most ``max_chain`` ops."""
    rng = random.Random(seed)
    best: tuple[float, Events] | None = None
    for attempt in range(1 + restarts):
        try:
            events = _plan(problem, budget_bytes, allow_swap, stop, rng if attempt else None, max_chain)
        except dl.OutOfTime:
            break
        if events is None:
            continue
        try:
            t = replay(problem, events, budget_bytes).time
        except ScheduleError:  # the plan's memory model is conservative: not expected, but checked
            continue
        if best is None or t < best[0]:
            best = (t, events)
    return None if best is None else best[1]


def _plan(p: Problem, budget: int, allow_swap: bool, stop: dl.Deadline, rng: random.Random | None,
          max_chain: int) -> Events | None:
    gaps = _Gaps(p)
    mem, live_at = plain_memory(p, stop)
    excess = [m - budget for m in mem]
    evicted: list[set[int]] = [set() for _ in range(p.n)]  # gap indices evicted, per tensor
    swapped = [False] * p.n  # tensor swapped out once (later swap-ins cost one transfer)
    by_swap: dict[tuple[int, int], bool] = {}
    needs_at: list[list[int]] = [[] for _ in range(p.n)]  # steps where u must be resident to recompute a reader
    chains: dict[tuple[int, int], list[int]] = {}  # ops recomputed (in order) to restore a gap
    paid: dict[tuple[int, int], float] = {}  # each evicted gap's restore cost
    extra: dict[tuple[int, int], int] = {}  # bytes of a restore's missing ancestors, held at its step
    transient = [0] * p.n  # peak bytes of the recomputes before step s beyond the restored tensors

    def restoring(s: int) -> int:
        """Excess bytes while step s's restores run: what stays resident before its compute and the peak of
        the recomputes that restore (ancestors freed after their last reader there)."""
        return excess[s] - p.ops[s].bytes - p.ops[s].workspace + transient[s]

    def resident_at(w: int, step: int) -> bool:
        """w is on the device at ``step`` under the plan (before any restore there)."""
        if gaps.last[w] < step or w >= step:
            return False
        k = gaps.covering(w, step)
        return k is None or k not in evicted[w]

    def chain(u: int, b: int, cap: float = INF) -> tuple[float, list[int], set[int]] | None:
        """Recomputing u just before step b: (op time of u and of the ancestors that are not on the device
        then, those ancestors and u in program order, the resident tensors they read); None if an
        ancestor cannot be recomputed, the chain exceeds ``max_chain`` ops or costs more than ``cap``, or its
        ancestors' bytes (held while step b's restores run, freed before its compute) need more room than
        that compute."""
        members, reads, todo = {u}, set(), [u]
        cap *= 1 + 1e-9  # a running sum: prune only what is surely dearer
        spent = p.ops[u].time
        while todo:
            v = todo.pop()
            if not p.ops[v].recompute:
                return None
            for w in p.inputs[v]:
                if resident_at(w, b):
                    reads.add(w)
                elif w not in members:
                    members.add(w)
                    todo.append(w)
                    spent += p.ops[w].time
                    if len(members) > max_chain or spent > cap:
                        return None
        order = sorted(members)
        extra = chain_peak(p, order)
        # the ancestors are freed before step b's compute: they may use the room that compute needs, never more
        if restoring(b) + extra > max(excess[b], 0):
            return None
        return math.fsum(p.ops[w].time for w in members), order, reads

    def cost(u: int, k: int, cap: float = INF) -> tuple[float, bool]:
        """Cheapest restore of u's gap k (its cost, whether by swap-in); INF if none costs at most ``cap``."""
        a, b = gaps.stops[u][k], gaps.stops[u][k + 1]
        if any(a < s < b for s in needs_at[u]):  # a reader's recompute needs u inside this gap
            return INF, False
        if b >= p.n:  # a keep op's last stretch: it must be on the device at the end
            return INF, False
        found = chain(u, b, cap)
        rc = INF if found is None else found[0]
        sw = INF
        if allow_swap and p.ops[u].swap:
            sw = p.transfer_time(u) * (1 if swapped[u] else 2)
        return (sw, True) if sw < rc else (rc, False)

    over = [s for s in range(p.n) if excess[s] > 0]
    counter = _Counter([e > 0 for e in excess])
    heap = [(-excess[s], s) for s in over]  # worst step first
    heapq.heapify(heap)
    while heap:
        stop.check()
        neg, s = heapq.heappop(heap)
        if excess[s] <= 0:
            continue
        if -neg != excess[s]:
            heapq.heappush(heap, (-excess[s], s))
            continue
        best: tuple[float, int, int, int, bool] | None = None
        for u in live_at[s]:
            k = gaps.covering(u, s)
            if k is None or k in evicted[u]:
                continue
            stop.check()
            a, b = gaps.stops[u][k], gaps.stops[u][k + 1]
            span = counter.prefix(min(b, p.n)) - counter.prefix(a + 1)
            weight = (1 + RESTART_NOISE * rng.random() if rng is not None else 1.0) / (max(1, p.ops[u].bytes) * span)
            # branch and bound: a restore dearer than the best score so far cannot win
            c, sw = cost(u, k, INF if best is None else best[0] / weight)
            if c == INF:
                continue
            score = c * weight
            key = (score, -p.ops[u].bytes, u, k, sw)
            if best is None or key < best:
                best = key
        if best is None:
            return None  # nothing evictable relieves this step without a cascade
        _, _, u, k, sw = best
        paid[(u, k)] = cost(u, k)[0]
        evicted[u].add(k)
        by_swap[(u, k)] = sw
        swapped[u] = swapped[u] or sw
        a, b = gaps.stops[u][k], gaps.stops[u][k + 1]
        if not sw:
            found = chain(u, b)
            assert found is not None
            _, members, reads = found
            chains[(u, k)] = members
            for w in reads:
                needs_at[w].append(b)
            extra[(u, k)] = chain_peak(p, members)
            transient[b] += extra[(u, k)]  # held while restoring, freed before b's compute
        for t in range(a + 1, min(b, p.n)):
            if excess[t] > 0 >= excess[t] - p.ops[u].bytes:
                counter.add(t, -1)
            excess[t] -= p.ops[u].bytes
        if excess[s] > 0:
            heapq.heappush(heap, (-excess[s], s))
    # keep again the gaps later evictions made unnecessary (every step they span has room), costliest first
    for (u, k), _ in sorted(paid.items(), key=lambda item: -item[1]):
        stop.check()
        a, b = gaps.stops[u][k], gaps.stops[u][k + 1]
        size = p.ops[u].bytes
        if all(max(excess[t], restoring(t)) + size <= 0 for t in range(a + 1, min(b, p.n))):
            evicted[u].discard(k)
            for t in range(a + 1, min(b, p.n)):
                excess[t] += size
            transient[b] -= extra.get((u, k), 0)
    return _events(p, gaps, evicted, by_swap, chains)


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


def _events(p: Problem, gaps: _Gaps, evicted: list[set[int]], by_swap: dict[tuple[int, int], bool],
            chains: dict[tuple[int, int], list[int]]) -> Events:
    """The plan as events: restores before each first compute, frees after it (a tensor after its last
    reader, or at the start of an evicted gap, swapped out first when the gap is restored by swap-in)."""
    restore_at: list[list[tuple[int, int]]] = [[] for _ in range(p.n + 1)]
    free_after: list[list[tuple[int, int]]] = [[] for _ in range(p.n)]
    for u in range(p.n):
        stops = gaps.stops[u]
        for k in evicted[u]:
            free_after[stops[k]].append((u, k))
            restore_at[stops[k + 1]].append((u, k))
        if u not in p.keep_idx:
            free_after[stops[-1]].append((u, -1))
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
