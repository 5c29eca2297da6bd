"""Retain a recomputed tensor instead of recomputing it again: a pass from a valid event list to a valid,
no slower one under the same budget.

Eviction plans restore each tensor on their own: on wide DAGs at tight budgets the same ancestors are
recomputed for many restores a few steps apart (on a 2000-op layered DAG at 80% of the plain peak the
DTR-style plan recomputed 322 ops 1367 times; once each would have cost a quarter of it). The pass first
deletes every recompute that nothing reads before its free (a CP-SAT probe's schedule of a ~100M Llama
recomputed 317 forward ops after the last backward op, one reading a parameter already updated). It merges
two consecutive instances of a tensor, the first freed and the second made by a compute, by deleting that
free and that compute, wherever the tensor's bytes fit under the budget at every event in between; the
recomputes that then have no reader are deleted too (which frees their memory). Candidates go in order of
the time saved per byte-event held, until none is left or the deadline passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainplan.schedule import deadline as dl
from trainplan.schedule.heuristic import Events
from trainplan.schedule.problem import Problem
from trainplan.schedule.replay import ScheduleError

GONE = np.iinfo(np.int64).min // 4  # the level of a deleted event: never the maximum


@dataclass
class _Instance:
    """One stay of a tensor on the device: made at event ``start`` (by a compute, or a swap-in), freed at
    event ``end`` (None: resident at the end); the instances a compute read, and the instances reading it."""

    idx: int
    op: int
    start: int
    by_compute: bool
    first: bool  # the op's first compute (never deleted)
    end: int | None = None
    inputs: list[int] = field(default_factory=list)
    readers: set[int] = field(default_factory=set)
    swapped: bool = False  # swapped out during its stay (a later swap-in needs that host copy)
    alive: bool = True


class _Events:
    """The event list with its instances and the memory level at each event (bytes a budget must cover)."""

    def __init__(self, p: Problem, events: Events) -> None:
        self.p = p
        self.kinds = [k for k, _ in events]
        self.ops = [p.index[o] for _, o in events]
        self.deleted = np.zeros(len(events), dtype=bool)
        self.inst: list[_Instance] = []
        self.of_op: list[list[int]] = [[] for _ in range(p.n)]  # each op's instances in event order
        level = np.empty(len(events), dtype=np.int64)
        current: dict[int, int] = {}
        used = p.fixed_bytes
        for pos, (kind, u) in enumerate(zip(self.kinds, self.ops)):
            op = p.ops[u]
            needed = p.inputs[u] if kind == "compute" else () if kind == "swap_in" else (u,)
            if any(w not in current for w in needed):
                raise ScheduleError(f"event {pos} {kind} '{op.id}': a tensor it needs is not resident")
            if kind in ("compute", "swap_in"):
                i = len(self.inst)
                new = _Instance(i, u, pos, kind == "compute", kind == "compute" and not self.of_op[u])
                if kind == "compute":
                    new.inputs = [current[w] for w in p.inputs[u]]
                    for j in new.inputs:
                        self.inst[j].readers.add(i)
                self.inst.append(new)
                self.of_op[u].append(i)
                current[u] = i
                level[pos] = used + op.bytes + (op.workspace if kind == "compute" else 0)
                used += op.bytes
            elif kind == "free":
                self.inst[current.pop(u)].end = pos
                used -= op.bytes
                level[pos] = used
            else:  # swap_out: the tensor stays until its free
                self.inst[current[u]].swapped = True
                level[pos] = used
        self.level = level

    def merge(self, i: int, j: int, budget: int) -> bool:
        """Keep instance i of a tensor until its next instance j ends (delete i's free and j's compute) if
        its bytes fit at every event in between; then delete the recomputes left without a reader."""
        a, b = self.inst[i], self.inst[j]
        f, c = a.end, b.start
        size = self.p.ops[a.op].bytes
        if f is None or not b.by_compute or (c - f > 1 and self.level[f + 1:c].max() + size > budget):
            return False
        self.level[f + 1:c] += size
        self._delete(f)
        self._delete(c)
        a.end, a.readers, a.swapped = b.end, a.readers | b.readers, a.swapped or b.swapped
        for r in b.readers:
            self.inst[r].inputs = [i if x == j else x for x in self.inst[r].inputs]
        b.alive = False
        self.of_op[b.op].remove(j)
        self._drop_reads(b)
        return True

    def drop_unread(self) -> None:
        """Delete each recompute that nothing reads before its free, and the recomputes only it read."""
        for inst in self.inst:
            if self._unread(inst):
                self._drop(inst)

    def _unread(self, inst: _Instance) -> bool:
        return (inst.alive and not inst.readers and not inst.first and inst.by_compute and inst.end is not None
                and not inst.swapped)

    def _drop(self, inst: _Instance) -> None:
        """Delete ``inst``'s compute and free, and then the recomputes left without a reader."""
        todo = [inst]
        while todo:
            g = todo.pop()
            if not g.alive:
                continue
            self.level[g.start + 1:g.end] -= self.p.ops[g.op].bytes
            self._delete(g.start)
            self._delete(g.end)
            g.alive = False
            self.of_op[g.op].remove(g.idx)
            todo.extend(self._lose_reader(g))

    def _drop_reads(self, gone: _Instance) -> None:
        """``gone``'s compute is deleted: its inputs lose a reader; delete each recompute left without one."""
        for src in self._lose_reader(gone):
            self._drop(src)

    def _lose_reader(self, gone: _Instance) -> list[_Instance]:
        """``gone``'s inputs, each without ``gone`` as a reader: those left unread."""
        left = []
        for x in gone.inputs:
            src = self.inst[x]
            src.readers.discard(gone.idx)
            if self._unread(src):
                left.append(src)
        return left

    def _delete(self, pos: int) -> None:
        self.deleted[pos] = True
        self.level[pos] = GONE

    def events(self) -> Events:
        return [(k, self.p.ops[u].id) for k, u, d in zip(self.kinds, self.ops, self.deleted) if not d]


def retain_recomputes(problem: Problem, events: Events, budget: int, stop: dl.Deadline = dl.NEVER) -> Events:
    """``events`` (valid under ``budget``) without the recomputes nothing reads, and with recomputes replaced by
    keeping an earlier instance of the same tensor wherever it fits (module docstring); stops early, with what it
    has, at ``stop``. Raises
    ScheduleError where an event needs a tensor that is not resident (``events`` are not valid)."""
    ev = _Events(problem, events)
    ev.drop_unread()
    ops = problem.ops
    while not stop.passed():
        pairs = []  # (-time saved per byte-event, first instance, next instance)
        for insts in ev.of_op:
            for i, j in zip(insts, insts[1:]):
                a, b = ev.inst[i], ev.inst[j]
                if a.end is not None and b.by_compute:
                    span = max(1, b.start - a.end) * max(1, ops[a.op].bytes)
                    pairs.append((-ops[a.op].time / span, i, j))
        pairs.sort()
        merged = 0
        for _, i, j in pairs:
            if stop.passed():
                break
            a, b = ev.inst[i], ev.inst[j]
            if a.alive and b.alive and ev.of_op[a.op].index(i) + 1 == ev.of_op[a.op].index(j):
                merged += ev.merge(i, j, budget)
        if not merged:
            break
    return ev.events()
