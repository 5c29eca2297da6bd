"""Independent replay checker: validates an event list and recomputes time and peak exactly."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainplan.schedule.problem import Problem

EVENT_KINDS = ("compute", "free", "swap_out", "swap_in")


class ScheduleError(ValueError):
    """An event list violates the schedule semantics; the message names the event and op."""


@dataclass(frozen=True)
class Replay:
    """What a valid event list costs: step time (s), peak device bytes and event counts."""

    time: float
    peak_bytes: int
    computes: int
    recomputes: int
    swap_ins: int
    swap_outs: int


def replay(problem: Problem, events: Iterable[Sequence[str]], budget_bytes: int | None = None) -> Replay:
    """Replay ``events``; raise ScheduleError on the first violation (or peak > ``budget_bytes``).

    time = sum of op times over compute events + bytes/bandwidth over swap_in and swap_out events
    (summed exactly with ``math.fsum``); peak = fixed_bytes + the largest resident bytes, counting
    output + workspace during a compute. A kernel's further outputs (ops with ``of``) exist from its first
    compute: they are taken at once, no compute or swap_in may come between that compute and theirs.
    """
    ops, n = problem.ops, problem.n
    resident = [False] * n
    host = [False] * n
    done = [0] * n
    used = peak = problem.fixed_bytes
    terms: list[float] = []
    counts = {kind: 0 for kind in EVENT_KINDS}
    untaken: list[int] = []  # further outputs of the kernel just computed, not taken yet

    for pos, event in enumerate(events):
        if not isinstance(event, (list, tuple)) or len(event) != 2:
            raise ScheduleError(f"event {pos}: expected [kind, op], got {event!r}")
        kind, oid = event
        if kind not in EVENT_KINDS:
            raise ScheduleError(f"event {pos}: unknown kind {kind!r}")
        if oid not in problem.index:
            raise ScheduleError(f"event {pos} {kind}: unknown op {oid!r}")
        u = problem.index[oid]
        op = ops[u]
        where = f"event {pos} {kind} '{oid}'"
        counts[kind] += 1
        if kind in ("compute", "swap_in") and untaken and (kind == "swap_in" or u not in untaken):
            raise ScheduleError(f"{where}: '{ops[untaken[0]].id}', a further output of '{ops[untaken[0]].of}', "
                                "must be computed first (a kernel's outputs are taken at once)")
        if kind == "compute" and op.of is not None and not untaken:
            raise ScheduleError(f"{where}: a further output of '{op.of}' is computed only right after "
                                "that op's first compute")
        if kind == "compute":
            if resident[u]:
                raise ScheduleError(f"{where}: op is already resident")
            if done[u] and not op.recompute:
                raise ScheduleError(f"{where}: op has recompute=false and was already computed")
            missing = [ops[w].id for w in problem.inputs[u] if not resident[w]]
            if missing:
                raise ScheduleError(f"{where}: input(s) {missing} not resident")
            peak = max(peak, used + op.bytes + op.workspace)
            used += op.bytes
            resident[u] = True
            done[u] += 1
            terms.append(op.time)
            if untaken:
                untaken.remove(u)
            elif done[u] == 1:
                untaken = list(problem.outputs_of.get(u, ()))
        elif kind == "free":
            if not resident[u]:
                raise ScheduleError(f"{where}: op is not resident")
            used -= op.bytes
            resident[u] = False
        else:
            if not op.swap:
                raise ScheduleError(f"{where}: op has swap=false")
            if kind == "swap_out":
                if not resident[u]:
                    raise ScheduleError(f"{where}: op is not resident")
                host[u] = True
            else:
                if resident[u]:
                    raise ScheduleError(f"{where}: op is already resident")
                if not host[u]:
                    raise ScheduleError(f"{where}: no host copy (swap_out first)")
                used += op.bytes
                peak = max(peak, used)
                resident[u] = True
            terms.append(op.bytes / problem.bandwidth)
        if budget_bytes is not None and peak > budget_bytes:
            raise ScheduleError(f"{where}: device bytes {peak} exceed budget {budget_bytes}")

    if untaken:
        raise ScheduleError(f"'{ops[untaken[0]].id}', a further output of '{ops[untaken[0]].of}', is never taken")
    never = [ops[u].id for u in range(n) if not done[u]]
    if never:
        raise ScheduleError(f"op(s) never computed: {never[:10]}")
    absent = [ops[u].id for u in sorted(problem.keep_idx) if not resident[u]]
    if absent:
        raise ScheduleError(f"keep op(s) not resident at the end: {absent[:10]}")
    return Replay(
        time=math.fsum(terms),
        peak_bytes=peak,
        computes=counts["compute"],
        recomputes=counts["compute"] - n,
        swap_ins=counts["swap_in"],
        swap_outs=counts["swap_out"],
    )


def take_outputs_at_once(problem: Problem, events: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    """``events`` with every further output's compute moved to right after its kernel's first compute, as
    :func:`replay` requires (what a kernel really does: its outputs exist from that moment; the move keeps
    the schedule valid and counts the memory they hold meanwhile)."""
    if not problem.outputs_of:
        return [(str(k), str(o)) for k, o in events]
    extra = {problem.ops[v].id for vs in problem.outputs_of.values() for v in vs}
    out: list[tuple[str, str]] = []
    started: set[str] = set()
    for kind, oid in events:
        if kind == "compute" and oid in extra:
            continue
        out.append((kind, oid))
        u = problem.index.get(oid)
        if kind == "compute" and u is not None and oid not in started:
            started.add(oid)
            out += [("compute", problem.ops[v].id) for v in problem.outputs_of.get(u, ())]
    return out
