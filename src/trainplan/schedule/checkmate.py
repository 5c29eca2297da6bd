"""Baseline 3: Checkmate's recompute-only MILP (Jain et al. 2020) on CP-SAT; above MAX_VARIABLES its LP
relaxation with rounding (``checkmate_lp.py``).

Stage t computes op t for the first time; R[t,i] = op i computed in stage t, S[t,i] = i kept on
device from stage t-1 into t, FREE[t,i,k] = i freed right after computing k in stage t. Memory
U[t,k] is tracked after each computation; the model has O(n^2) stages x positions, so large graphs
get the LP rounding instead, and a MILP that times out reports its best incumbent, if any.
"""

from __future__ import annotations

import math
import time
from typing import Any

from ortools.sat.python import cp_model

from trainplan.schedule.checkmate_lp import checkmate_lp
from trainplan.schedule.heuristic import Limits, greedy
from trainplan.schedule.mip import CpSatRun, _ticks, byte_unit, configure, time_unit
from trainplan.schedule.problem import Problem
from trainplan.schedule.schedule_io import Schedule, from_events, no_schedule

MAX_VARIABLES = 300_000
MILP_SECONDS_PER_VARIABLE = 2e-5  # building the CP-SAT model: measured 12-22 us per variable on this host
MILP_BUILD_SHARE = 0.5  # the MILP is built only if its estimated build time fits in this share of the limit
MIN_LIMIT_S = 0.05  # with less time than this (a compare() whose other baselines used the share), nothing starts
MILP_STOP_SECONDS_PER_VARIABLE = 1e-5  # CP-SAT returns this long after its max_time on this model: measured
# 6.2 us per variable here (1.2 s past a 5.9 s limit at 189k variables, the 250-op layered DAG)


def model_size(problem: Problem) -> int:
    """Number of R, S, FREE and U variables the model would have."""
    n = problem.n
    # FREE: at stage t, one per input of each position i <= t, plus one: op i's (len + 1) counted n - i times
    free = sum((len(ins) + 1) * (n - i) for i, ins in enumerate(problem.inputs))
    return free + 2 * n * (n + 1) // 2 + n * (n + 1) // 2


def _stage_hint(problem: Problem, events: list[tuple[str, str]]) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """(R, S) index sets of a recompute-only event list: stage = index of the next first compute."""
    n = problem.n
    R: set[tuple[int, int]] = set()
    resident_at_start: list[set[int]] = []
    resident: set[int] = set()
    used_in: list[set[int]] = [set() for _ in range(n)]
    t = 0
    for kind, oid in events:
        u = problem.index[oid]
        if kind == "compute":
            if t < n:
                R.add((t, u))
                used_in[t].update(problem.inputs[u])
            resident.add(u)
            if u == t:
                t += 1
                resident_at_start.append(set(resident))
        elif kind == "free":
            resident.discard(u)
    S: set[tuple[int, int]] = set()
    keep_next = set(problem.keep_idx)
    for t in range(n - 1, 0, -1):  # keep i into stage t only if stage t uses it or passes it on
        keep_now = {i for i in resident_at_start[t - 1] if i < t and (i in used_in[t] or i in keep_next)}
        S.update((t, i) for i in keep_now)
        keep_next = keep_now
    return R, S


def _build(p: Problem, bu: int, tu: float, deadline: float) -> tuple[cp_model.CpModel, dict, dict] | None:
    """The MILP at ``p.budget_bytes`` (R, S, FREE, U; memory in units of ``bu`` bytes, time in ticks of ``tu``
    s), hinted with the recompute-only greedy schedule where one fits; None if ``deadline`` (perf_counter)
    passes first."""
    n = p.n
    cap_units = (p.budget_bytes - p.fixed_bytes) // bu
    b = [math.ceil(op.bytes / bu) for op in p.ops]
    m = cp_model.CpModel()
    R: dict[tuple[int, int], Any] = {}
    S: dict[tuple[int, int], Any] = {}
    for t in range(n):
        for i in range(t + 1):
            R[t, i] = m.NewConstant(1) if i == t else (  # a further output's stage computes it alone
                m.NewBoolVar(f"R{t}_{i}") if p.ops[i].recompute and p.ops[t].of is None else m.NewConstant(0))
        for i in range(t):
            S[t, i] = m.NewBoolVar(f"S{t}_{i}")
    for i in range(n):  # the final state: keep ops on device, nothing else
        S[n, i] = m.NewConstant(1 if i in p.keep_idx else 0)
    events = greedy(p, p.budget_bytes, allow_swap=False, limits=Limits(deadline))  # recompute-only greedy: a hint
    hr, hs = _stage_hint(p, events) if events is not None else (None, None)

    def rv(t: int, i: int) -> bool:
        return i == t or (t, i) in hr

    def sv(t: int, i: int) -> bool:
        return i in p.keep_idx if t == n else (t, i) in hs

    for t in range(n):
        if time.perf_counter() > deadline:
            return None
        for j in range(t + 1):
            for i in p.inputs[j]:
                m.Add(R[t, j] <= R[t, i] + S[t, i])  # inputs on device before a compute
            m.Add(S[t + 1, j] <= R[t, j] + (S[t, j] if j < t else 0))  # kept only if present
            if j < t:
                m.Add(R[t, j] + S[t, j] <= 1)  # never recompute a resident op
        U = sum(b[i] * S[t, i] for i in range(t))
        uh = sum(b[i] for i in range(t) if hr is not None and sv(t, i))
        for k in range(t + 1):  # memory after computing k, then frees of k's inputs and k
            U = U + b[k] * R[t, k]
            m.Add(U + math.ceil(p.ops[k].workspace / bu) * R[t, k] <= cap_units)
            freed = []
            uh += b[k] * (hr is not None and rv(t, k))
            for i in (*p.inputs[k], k):
                later = [j for j in p.users[i] if k < j <= t]
                lits = [R[t, k], S[t + 1, i].Not(), *[R[t, j].Not() for j in later]]
                f = m.NewBoolVar(f"F{t}_{i}_{k}")
                m.AddBoolAnd(lits).OnlyEnforceIf(f)
                m.AddBoolOr([x.Not() for x in lits] + [f])
                freed.append(b[i] * f)
                if hr is not None:
                    fh = rv(t, k) and not sv(t + 1, i) and not any(rv(t, j) for j in later)
                    m.AddHint(f, fh)
                    uh -= b[i] * fh
            u_next = m.NewIntVar(0, cap_units, f"U{t}_{k}")
            m.Add(u_next == U - sum(freed))
            if hr is not None:
                m.AddHint(u_next, min(max(uh, 0), cap_units))
            U = u_next
    m.Minimize(sum(_ticks(p.ops[i].time, tu) * R[t, i] for (t, i) in R))
    if hr is not None:
        for (t, i), var in R.items():
            if i != t and p.ops[i].recompute and p.ops[t].of is None:
                m.AddHint(var, rv(t, i))
        for (t, i), var in S.items():
            if t < n:
                m.AddHint(var, sv(t, i))
    return m, R, S


def _decode(p: Problem, solver: cp_model.CpSolver, R: dict, S: dict) -> list[tuple[str, str]]:
    """Events of a solution: each stage's computes in order, each followed by the frees it allows."""
    events: list[tuple[str, str]] = []
    resident: set[int] = set()
    for t in range(p.n):
        for k in range(t + 1):
            if not solver.BooleanValue(R[t, k]):
                continue
            events.append(("compute", p.ops[k].id))
            resident.add(k)
            for i in (*p.inputs[k], k):
                later = any(solver.BooleanValue(R[t, j]) for j in p.users[i] if k < j <= t)
                if not later and not solver.BooleanValue(S[t + 1, i]) and i in resident:
                    events.append(("free", p.ops[i].id))
                    resident.discard(i)
        for i in sorted(resident):
            if not solver.BooleanValue(S[t + 1, i]):
                events.append(("free", p.ops[i].id))
                resident.discard(i)
    return events


def checkmate(problem: Problem, *, time_limit_s: float = 10.0, workers: int = 2, seed: int = 0) -> Schedule:
    """Checkmate at ``problem.budget_bytes`` within ``time_limit_s``: the MILP where it is built (up to
    MAX_VARIABLES, and if its estimated build time fits MILP_BUILD_SHARE of the limit), else its LP
    relaxation with rounding (``checkmate_lp``). The status says what is known:
    ``infeasible`` only with a proof (the MILP's, or fixed bytes over the budget), ``unknown`` when the time
    ran out without a schedule, ``not_built`` when no model could be built in time, ``over_budget`` for a
    rounded schedule that does not fit (its time and peak are given)."""
    t0 = time.perf_counter()
    p, budget = problem, problem.budget_bytes
    cap = budget - p.fixed_bytes
    if cap < 0:
        return no_schedule(budget, "checkmate", time.perf_counter() - t0, "fixed_bytes exceed the budget",
                           {"milp_status": "INFEASIBLE"})
    if time_limit_s < MIN_LIMIT_S:
        return no_schedule(budget, "checkmate", time.perf_counter() - t0,
                           f"not started: {max(time_limit_s, 0.0):.2f} s of the time limit left",
                           {"milp_status": "NOT_BUILT"}, status="not_built")
    size = model_size(p)
    build_s = MILP_SECONDS_PER_VARIABLE * size
    if size > MAX_VARIABLES or build_s > MILP_BUILD_SHARE * time_limit_s:
        why = (f"{size} variables > {MAX_VARIABLES} (O(n^2) stage grid)" if size > MAX_VARIABLES else
               f"{size} variables: ~{build_s:.1f} s to build, over {MILP_BUILD_SHARE:.0%} of the time limit")
        return checkmate_lp(p, time_limit_s=time_limit_s, seed=seed,
                            extra={"milp_status": "NOT_BUILT", "milp_variables": size, "milp_note": why})
    bu, tu = byte_unit(cap), time_unit(p)
    built = _build(p, bu, tu, deadline=t0 + time_limit_s)
    if built is None:
        return no_schedule(budget, "checkmate", time.perf_counter() - t0,
                           f"the MILP ({size} variables) was not built within the time limit",
                           {"variant": "milp", "milp_status": "NOT_BUILT", "milp_variables": size}, status="not_built")
    m, R, S = built
    left = max(0.05, time_limit_s - (time.perf_counter() - t0) - MILP_STOP_SECONDS_PER_VARIABLE * size)
    solver = configure(CpSatRun(left, workers, seed, deterministic=False))
    solver.parameters.cp_model_probing_level = 0  # probing dominates presolve on this model
    code = solver.Solve(m)
    status = solver.StatusName(code)
    wall = time.perf_counter() - t0
    extra = {"variant": "milp", "milp_status": status, "milp_variables": len(m.Proto().variables),
             "time_unit_s": tu, "byte_unit": bu}
    if code == cp_model.INFEASIBLE:
        return no_schedule(budget, "checkmate", wall, "the recompute-only MILP is proven infeasible at this budget",
                           extra)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return no_schedule(budget, "checkmate", wall, "time limit without a solution", extra, status="unknown")
    extra["milp_bound_recompute_only"] = solver.BestObjectiveBound() * tu
    return from_events(p, _decode(p, solver, R, S), method="checkmate", solve_seconds=wall, extra=extra)
