"""Lower bounds on the step time: the trivial one and a live-interval knapsack relaxation."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from trainplan.schedule import deadline as dl
from trainplan.schedule.mip import CpSatRun, _ticks, configure, time_unit, used_seconds
from trainplan.schedule.problem import Problem


RELAX_SECONDS_PER_TERM = 10e-6  # building and loading the model: 7-16 us per memory-row term here (250-2000 ops)
RELAX_DET_PER_SECOND = 0.2  # this small model advances CP-SAT's deterministic clock ~0.35-0.4 per wall s here


@dataclass(frozen=True)
class Bound:
    """A valid lower bound (s) at one budget; ``infeasible`` when the relaxation proves no schedule exists."""

    seconds: float
    ticks: int  # the same bound in CP-SAT objective ticks of mip.solve_mip (op times rounded down)
    status: str
    infeasible: bool = False
    evict: frozenset[tuple[int, int]] = frozenset()  # (op, next reader) gaps the relaxation does not keep
    work_s: float = 0.0  # seconds of its time limit the solve used (mip.used_seconds)


def floor_proof(problem: Problem, budget_bytes: int) -> str | None:
    """Why no schedule fits ``budget_bytes`` by the single-op working-set floor (``Problem.floor_bytes``):
    the fixed bytes, the keep set or one op's inputs + output + workspace alone exceed it; else None."""
    p = problem
    if p.fixed_bytes > budget_bytes:
        return f"single-op floor: fixed_bytes {p.fixed_bytes} B > budget {budget_bytes} B"
    keep = sum(p.ops[u].bytes for u in p.keep_idx)
    if p.fixed_bytes + keep > budget_bytes:
        return f"single-op floor: fixed {p.fixed_bytes} B + keep set {keep} B > budget {budget_bytes} B"
    u = max(range(p.n), key=p.working_sets.__getitem__)
    if p.fixed_bytes + p.working_sets[u] > budget_bytes:
        return (f"single-op floor: op '{p.ops[u].id}' needs {p.working_sets[u]} B (inputs, output, workspace) "
                f"+ fixed {p.fixed_bytes} B > budget {budget_bytes} B")
    return None


RELAXATION_PROOF = ("relaxation: the live-interval relaxation (bounds.relaxation_bound), which every schedule "
                    "maps onto, has no solution within the budget (CP-SAT proof)")


def relaxation_terms(problem: Problem) -> int:
    """Memory-row terms of the relaxation: the first computes strictly inside each tensor's gaps."""
    p, terms = problem, 0
    for u in range(p.n):
        start = u
        for end in [*p.users[u], *([p.n] if u in p.keep_idx else [])]:
            terms += max(0, end - start - 1)
            start = end
    return terms


def trivial_bound(problem: Problem, status: str) -> Bound:
    """The sum of op times (every op computed once): the bound when no relaxation was solved."""
    tu = time_unit(problem)
    return Bound(problem.compute_time, sum(_ticks(op.time, tu) for op in problem.ops), status)


def relaxation_bound(problem: Problem, budget_bytes: int, run: CpSatRun) -> Bound:
    """Relaxation: each tensor's life is cut into gaps between consecutive first-compute readers
    (and to the end for keep ops); a gap is either kept on the device through every first compute
    strictly inside it, or costs at least one recompute (op time) or one swap-in (one transfer),
    and a tensor swapped in at all pays one swap-out.
    Memory rows count kept gaps plus each op's inputs, output and workspace at its first compute.
    Every schedule maps onto a feasible point of equal or larger cost, so the optimum (and the
    solver's proven bound) of this integer program bounds the true optimum from below.
    ``run``: the solve's limit, workers, seed and deterministic time (see mip.configure; its ``verbose`` and
    ``lns_share`` are not used); its ``wall_cap_s``, the wall time left to the whole call, stops the model build
    too (status ``NOT_BUILT``, the trivial bound).
    """
    stop = dl.current().earlier(None if run.wall_cap_s is None else time.perf_counter() + run.wall_cap_s)
    if relaxation_terms(problem) * RELAX_SECONDS_PER_TERM > stop.left():
        return trivial_bound(problem, "NOT_BUILT")
    try:
        return _relaxation_bound(problem, budget_bytes, run, stop)
    except dl.OutOfTime:
        return trivial_bound(problem, "NOT_BUILT")


def _relaxation_bound(problem: Problem, budget_bytes: int, run: CpSatRun, stop: dl.Deadline) -> Bound:
    p, n = problem, problem.n
    cap = budget_bytes - p.fixed_bytes
    base = sum(p.ops[u].bytes for u in p.keep_idx)
    if cap < 0 or base > cap:
        return Bound(math.inf, 0, "INFEASIBLE", True)
    tu = time_unit(p)
    const = sum(_ticks(op.time, tu) for op in p.ops)
    m = cp_model.CpModel()
    rows: list[list[tuple[int, object]]] = [[] for _ in range(n)]
    gaps: dict[tuple[int, int], cp_model.IntVar] = {}
    cost = []
    for u, op in enumerate(p.ops):
        stop.check()
        ends = list(p.users[u]) + ([n] if u in p.keep_idx else [])
        rc_t, sw_t = _ticks(op.time, tu), _ticks(p.transfer_time(u), tu)
        out = m.NewBoolVar(f"o{u}") if op.swap else None  # at least one swap-out per swapped tensor
        if out is not None:
            cost.append(sw_t * out)
        start = u
        for end in ends:
            if end - start > 1:  # some first compute lies strictly inside the gap
                x = m.NewBoolVar(f"k{u}_{end}")
                ways = []
                if op.recompute:
                    ways.append(m.NewBoolVar(f"r{u}_{end}"))
                    cost.append(rc_t * ways[-1])
                if out is not None:
                    ways.append(m.NewBoolVar(f"w{u}_{end}"))
                    m.AddImplication(ways[-1], out)
                    cost.append(sw_t * ways[-1])
                m.Add(x + sum(ways) == 1)  # kept, or restored by one recompute or swap-in
                gaps[(u, end)] = x
                for i in range(start + 1, end):
                    rows[i].append((op.bytes, x))
            start = end
    for i, own in enumerate(p.working_sets):
        stop.check()
        if own > cap:
            return Bound(math.inf, 0, "INFEASIBLE", True)
        if own + sum(b for b, _ in rows[i]) > cap:
            m.Add(sum(b * x for b, x in rows[i]) <= cap - own)
    if not cost:
        return Bound(p.compute_time, const, "OPTIMAL")
    m.Minimize(sum(cost))
    if stop.left() <= 0:
        raise dl.OutOfTime
    solver = configure(CpSatRun(run.time_limit_s, run.workers, run.seed, run.deterministic, wall_cap_s=stop.left()),
                       det_per_second=RELAX_DET_PER_SECOND)
    code = solver.Solve(m)
    status = solver.StatusName(code)
    work = used_seconds(solver, run.time_limit_s, run.deterministic)
    if code == cp_model.INFEASIBLE:
        return Bound(math.inf, 0, status, True, work_s=work)
    extra = max(0, math.ceil(solver.BestObjectiveBound() - 1e-6)) if code in (
        cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN) else 0
    evict = frozenset(g for g, x in gaps.items() if not solver.BooleanValue(x)) if code in (
        cp_model.OPTIMAL, cp_model.FEASIBLE) else frozenset()
    return Bound(p.compute_time + extra * tu, const + extra, status, evict=evict, work_s=work)
