"""Checkmate's LP relaxation with rounding (Jain et al., MLSys 2020, section 5), for graphs whose MILP is
not built.

The LP is the recompute-only MILP of ``checkmate.py`` with every variable in [0, 1] and Checkmate's
"hazard" form of FREE (two rows per FREE instead of one per literal): R[t,i] (op i computed in stage t),
S[t,i] (i kept on device from stage t-1 into t), FREE[t,i,k] and the memory M[t,k] after computing k in
stage t and its frees. It is built as a sparse matrix and solved by OR-Tools' PDLP under the time limit. Its S is rounded (deterministic thresholds, then randomized
rounding with a fixed seed) and, for each rounded S, the cheapest R that makes the schedule valid is
found (Checkmate's two-phase rounding, ``solve_r_opt``). Rounded schedules do not always fit the budget;
the cheapest that fits is the answer, else the one of least peak (reported over budget).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from ortools.pdlp import solve_log_pb2, solvers_pb2
from ortools.pdlp.python import pdlp

from trainplan.schedule.problem import Problem
from trainplan.schedule.replay import replay, take_outputs_at_once
from trainplan.schedule.schedule_io import Schedule, from_events, no_schedule

Events = list[tuple[str, str]]
THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # Checkmate's deterministic sweep
RANDOM_ROUNDS = 50  # randomized roundings after the sweep, while time is left
LP_SHARE = 0.7  # of the time limit: building and solving the LP; the rest (at least) rounds
STAGE_OVERHEAD = 50  # a stage's fixed cost in the build loop, in units of one op of its triangle (measured ~35)
CONVERT_SECONDS_PER_NONZERO = 1e-7  # building the sparse matrix after the stage loop, which nothing interrupts:
# measured 0.8-1.0e-8 s per nonzero up to 6.5M nonzeros (500-op layered DAG), 3.8e-8 at 27M and 5.3e-8 at 109M
# (1000 and 2000 ops, the memory's bandwidth), alone on the idle host; once 2.3x that in a bench run (a 2000-op
# LP's build took 12.7 s of a 9 s limit when this was a share of the loop's time)
BUILD_SHARE = 0.5  # of the LP's share: the stage loop of the build; the sparse matrix and PDLP get the rest
PDLP_SETUP_S_PER_NONZERO = 4e-7  # PDLP's setup outside its own time limit (copy, presolve, scaling): measured
# 0.6 s at 1.9M nonzeros and 2.5 s at 7.5M on this 2-core host under load; PDLP is not started without it
LP_BUDGET = 0.9  # the LP is solved at this fraction of the budget, as Checkmate's code does, so that more
# roundings fit the budget


@dataclass
class LpResult:
    """The LP's status, objective (seconds; a lower bound for recompute-only schedules when optimal),
    its S as a dense (n+1) x n array (None if no solution) and its size."""

    status: str
    objective_s: float | None
    s: np.ndarray | None
    variables: int
    constraints: int
    solver: str
    wall_s: float


def lp_variables(problem: Problem) -> int:
    """Variables of the LP: R and S (a triangle each), FREE (one per stage, op and its inputs), M."""
    n = problem.n
    per_k = np.array([len(ins) + 1 for ins in problem.inputs])
    free = int(np.sum(per_k * (n - np.arange(n))))  # (t, k, i) with k <= t
    tri = n * (n + 1) // 2
    return 3 * tri + free


def _edges(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """FREE edges (k, i) for i in inputs(k) and i = k, sorted by k; and for each edge e the readers j > k of
    i as flat pairs (edge, j)."""
    ek, ei, pe, pj = [], [], [], []
    for k, ins in enumerate(problem.inputs):
        for i in (*ins, k):
            for j in problem.users[i]:
                if j > k:
                    pe.append(len(ek))
                    pj.append(j)
            ek.append(k)
            ei.append(i)
    return (np.array(ek, dtype=np.int64), np.array(ei, dtype=np.int64),
            np.array(pe, dtype=np.int64), np.array(pj, dtype=np.int64))


@dataclass
class _Lp:
    """The LP in sparse form (constraint matrix by columns, as PDLP takes it); S(t, i) of the solution at
    ``s_base + t(t-1)/2 + i``."""

    matrix: sp.csc_matrix
    row_lo: np.ndarray
    row_hi: np.ndarray
    var_lo: np.ndarray
    var_hi: np.ndarray
    objective: np.ndarray
    s_base: int
    scale: float


def build_lp(problem: Problem, budget_bytes: int, deadline: float) -> _Lp | None:
    """The LP relaxation of Checkmate's MILP at ``budget_bytes`` (memory in units of the cap, time in units
    of the compute time), built a stage at a time with numpy; None if the build is projected to pass
    ``deadline`` (projected at every stage from the first tenth on: the loop by its stages' cost, the sparse
    matrix by the nonzeros) or passes it (checked at every stage and before the matrix is built)."""
    if time.perf_counter() > deadline:
        return None
    p, n = problem, problem.n
    cap = max(budget_bytes - p.fixed_bytes, 1)
    b = np.array([op.bytes for op in p.ops], dtype=float) / cap
    ws = np.array([op.workspace for op in p.ops], dtype=float) / cap
    scale = max(p.compute_time, 1e-12)
    cost = np.array([op.time for op in p.ops]) / scale
    tri = n * (n + 1) // 2
    ek, ei, pe, pj = _edges(p)
    n_edges = len(ek)
    cnt = np.searchsorted(ek, np.arange(n), side="right")  # edges with k <= t
    s_base, f_base = tri, 2 * tri
    m_base = f_base + int(cnt.sum())
    nvar = m_base + tri
    var_lo, var_hi, obj = np.zeros(nvar), np.ones(nvar), np.zeros(nvar)
    var_hi[m_base:] = np.inf
    recompute = np.array([op.recompute for op in p.ops])
    keep = np.zeros(n, dtype=bool)
    keep[list(p.keep_idx)] = True
    in_j = np.array([j for j, ins in enumerate(p.inputs) for _ in ins], dtype=np.int64)  # input edges (j, i)
    in_i = np.array([i for ins in p.inputs for i in ins], dtype=np.int64)
    in_cnt = np.searchsorted(in_j, np.arange(n), side="right")
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lo: list[np.ndarray] = []
    hi: list[np.ndarray] = []
    nrow = nnz = 0
    f_off = f_base

    def add(r: np.ndarray, c: np.ndarray, v: np.ndarray | float) -> None:
        nonlocal nnz
        nnz += len(c)
        rows.append(r)
        cols.append(c)
        vals.append(np.broadcast_to(np.asarray(v, dtype=float), c.shape))

    def bounds(count: int, low: float, high: float) -> int:
        nonlocal nrow
        first = nrow
        lo.append(np.full(count, low))
        hi.append(np.full(count, high))
        nrow += count
        return first

    start = time.perf_counter()
    for t in range(n):
        # stage t costs ~STAGE_OVERHEAD + t, its nonzeros grow with t: give up as soon as the projected build
        # (the loop and the sparse matrix) passes the deadline
        spent = time.perf_counter() - start
        done, total = (STAGE_OVERHEAD * x + x * x / 2 for x in (t, n))
        if start + spent > deadline or (t >= n // 10 and start + (spent + CONVERT_SECONDS_PER_NONZERO * nnz)
                                        * total / max(done, 1.0) > deadline):
            return None
        ks = np.arange(t + 1)
        R = t * (t + 1) // 2 + ks  # R(t, k), k = 0..t
        S = s_base + t * (t - 1) // 2 + np.arange(t)  # S(t, i), i < t
        S1 = s_base + (t + 1) * t // 2 + ks  # S(t+1, k), k = 0..t
        M = m_base + t * (t + 1) // 2 + ks
        obj[R] = cost[: t + 1]
        var_hi[R[:t]] = recompute[:t]
        var_lo[R[t]] = 1.0
        if t == n - 1:
            var_lo[S1] = var_hi[S1] = keep
        # inputs on device before a compute: R(t,j) - R(t,i) - S(t,i) <= 0
        m = in_cnt[t]
        r0 = bounds(m, -np.inf, 0.0) + np.arange(m)
        add(r0, R[in_j[:m]], 1.0)
        add(r0, R[in_i[:m]], -1.0)
        add(r0, S[in_i[:m]], -1.0)
        # kept only if present: S(t+1,j) - R(t,j) - S(t,j) <= 0; never recompute a resident op
        r0 = bounds(t + 1, -np.inf, 0.0) + ks
        add(r0, S1, 1.0)
        add(r0, R, -1.0)
        add(r0[:t], S, -1.0)
        r0 = bounds(t, -np.inf, 1.0) + np.arange(t)
        add(r0, R[:t], 1.0)
        add(r0, S, 1.0)
        # memory: before k's frees, M(t,k-1) (k = 0: the kept set) + (b_k + ws_k) R(t,k) <= cap
        r0 = bounds(t + 1, -np.inf, 1.0) + ks
        add(r0, R, b[: t + 1] + ws[: t + 1])
        add(r0[1:], M[:-1], 1.0)
        add(np.full(t, r0[0]), S, b[:t])
        # M(t,k) = M(t,k-1) + b_k R(t,k) - sum over k's edges of b_i FREE(t,e)
        r0 = bounds(t + 1, 0.0, 0.0) + ks
        add(r0, M, 1.0)
        add(r0, R, -b[: t + 1])
        add(r0[1:], M[:-1], -1.0)
        add(np.full(t, r0[0]), S, -b[:t])
        e = np.arange(cnt[t])
        F = f_off + e
        f_off += cnt[t]
        add(r0[ek[e]], F, b[ei[e]])
        # hazards h = 1 - R(t,k) + S(t+1,i) + sum R(t,j) over readers k < j <= t:
        # FREE >= 1 - h, and (2 + readers) (1 - FREE) >= h
        sel = (pe < cnt[t]) & (pj <= t)
        later = np.bincount(pe[sel], minlength=cnt[t])[: cnt[t]]
        big = 2.0 + later
        ra = bounds(cnt[t], 0.0, np.inf) + e
        add(ra, F, 1.0)
        rb = nrow + e
        lo.append(np.full(cnt[t], -np.inf))
        hi.append(big - 1.0)
        nrow += cnt[t]
        add(rb, F, big)
        for r in (ra, rb):
            add(r, R[ek[e]], -1.0)
            add(r, S1[ei[e]], 1.0)
            add(r[pe[sel]], R[pj[sel]], 1.0)
    assert f_off == m_base and n_edges == cnt[-1]
    if time.perf_counter() + CONVERT_SECONDS_PER_NONZERO * nnz > deadline:
        return None
    matrix = sp.csc_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                           shape=(nrow, nvar))
    return _Lp(matrix, np.concatenate(lo), np.concatenate(hi), var_lo, var_hi, obj, s_base, scale)


def solve_lp(problem: Problem, budget_bytes: int, time_limit_s: float) -> LpResult:
    """Build the LP relaxation at ``budget_bytes`` (the stage loop may use half of ``time_limit_s``) and solve
    it with PDLP in the rest, less its setup (NOT_STARTED if that leaves nothing). PDLP is first-order: at the time limit its current iterate is returned (status
    TIME_LIMIT) and can still be rounded. (GLOP and HiGHS, through OR-Tools' linear solver, took 20 s and
    7 s for the 29k-variable LP of ``training_graph(100)`` that PDLP solved in 7 s, and return nothing at
    the limit.)"""
    t0 = time.perf_counter()
    n, nvar = problem.n, lp_variables(problem)
    lp = build_lp(problem, budget_bytes, t0 + BUILD_SHARE * time_limit_s)
    if lp is None:
        return LpResult("NOT_BUILT", None, None, nvar, 0, "pdlp", time.perf_counter() - t0)
    left = time_limit_s - (time.perf_counter() - t0) - PDLP_SETUP_S_PER_NONZERO * lp.matrix.nnz
    if left < 0.05:
        return LpResult("NOT_STARTED", None, None, nvar, lp.matrix.shape[0], "pdlp", time.perf_counter() - t0)
    status, values, objective = _pdlp(lp, left)
    s = None
    if values is not None:
        s = np.zeros((n + 1, n))
        for t in range(1, n + 1):
            first = lp.s_base + t * (t - 1) // 2
            s[t, :t] = np.clip(values[first:first + t], 0.0, 1.0)
    return LpResult(status, None if objective is None else objective * lp.scale, s, nvar, lp.matrix.shape[0],
                    "pdlp", time.perf_counter() - t0)


def _pdlp(lp: _Lp, time_limit_s: float) -> tuple[str, np.ndarray | None, float | None]:
    qp = pdlp.QuadraticProgram()
    qp.objective_vector = lp.objective
    qp.constraint_matrix = lp.matrix
    qp.constraint_lower_bounds = lp.row_lo
    qp.constraint_upper_bounds = lp.row_hi
    qp.variable_lower_bounds = lp.var_lo
    qp.variable_upper_bounds = lp.var_hi
    params = solvers_pb2.PrimalDualHybridGradientParams()
    params.termination_criteria.time_sec_limit = time_limit_s
    params.num_threads = 1
    params.verbosity_level = 0
    result = pdlp.primal_dual_hybrid_gradient(qp, params)
    reason = solve_log_pb2.TerminationReason.Name(result.solve_log.termination_reason)
    status = "OPTIMAL" if reason == "TERMINATION_REASON_OPTIMAL" else reason.removeprefix("TERMINATION_REASON_")
    x = np.asarray(result.primal_solution)
    if x.shape != lp.objective.shape or not np.all(np.isfinite(x)):
        return status, None, None
    return status, x, float(lp.objective @ x) if status == "OPTIMAL" else None


def solve_r(problem: Problem, s: np.ndarray, deadline: float) -> list[list[int]] | None:
    """Checkmate's second phase: given a 0/1 S ((n+1) x n, S[n] the keep set), the cheapest R: each stage t
    computes t, every op it must hand on that it does not hold (S[t+1,i] and not S[t,i]) and, recursively,
    every input of those that it does not hold. An op that may not be recomputed is then held instead, from
    its compute to the stage that needs it (S grows; repeated until stable). The sorted computes of each
    stage, or None if ``deadline`` (perf_counter) passes first."""
    p, n = problem, problem.n
    no_rc = np.array([not op.recompute for op in p.ops])
    while True:
        stages: list[list[int]] = []
        grew = False
        for t in range(n):
            if time.perf_counter() > deadline:
                return None
            need = {t, *np.flatnonzero(s[t + 1, :t] > s[t, :t]).tolist()}
            stack = list(need)
            while stack:
                v = stack.pop()
                for u in p.inputs[v]:
                    if u not in need and not s[t, u]:
                        need.add(u)
                        stack.append(u)
            bad = [u for u in need if u != t and no_rc[u]]
            for u in bad:  # hold it from its compute into stage t
                s[u + 1:t + 1, u] = 1
                grew = True
            stages.append(sorted(need))
        if not grew:
            return stages


def rs_events(problem: Problem, s: np.ndarray, stages: list[list[int]]) -> Events:
    """Events of a rounded (R, S): at a stage's start, held ops it neither reads nor hands on are freed;
    each compute is followed by the frees of its inputs (and itself) that no later compute of the stage
    reads and the next stage does not hold."""
    p = problem
    ids = [op.id for op in p.ops]
    events: Events = []
    resident: set[int] = set()
    for t, computes in enumerate(stages):
        last: dict[int, int] = {}
        for k in computes:
            for i in (*p.inputs[k], k):
                last[i] = k
        keep_next = s[t + 1]
        for i in sorted(resident):
            if i not in last and not keep_next[i]:
                events.append(("free", ids[i]))
                resident.discard(i)
        for k in computes:
            events.append(("compute", ids[k]))
            resident.add(k)
            for i in (*p.inputs[k], k):
                if last[i] == k and not keep_next[i] and i in resident:
                    events.append(("free", ids[i]))
                    resident.discard(i)
    return take_outputs_at_once(p, events)


@dataclass
class Rounded:
    """The best rounding: its events, replayed time and peak, how it was rounded, and round counts."""

    events: Events | None
    time: float | None
    peak: int | None
    how: str | None
    rounds: int
    within_budget: int


def round_lp(problem: Problem, s_frac: np.ndarray, budget_bytes: int, deadline: float, seed: int) -> Rounded:
    """Round the LP's S (Checkmate's threshold sweep, then randomized rounding with ``seed``) until
    ``deadline``; for each rounded S the cheapest R (``solve_r``) gives a valid schedule, replayed. The
    cheapest within ``budget_bytes``, else the one of least peak (no events if the time ran out first)."""
    p, n = problem, problem.n
    rng = np.random.default_rng(seed)
    keep = np.zeros(n, dtype=np.int8)
    keep[list(p.keep_idx)] = 1
    best = Rounded(None, None, None, None, 0, 0)
    trials = [(f"threshold {x}", x) for x in THRESHOLDS] + [(f"randomized {i}", None) for i in range(RANDOM_ROUNDS)]
    for how, threshold in trials:
        s = (s_frac >= threshold) if threshold is not None else (rng.random(s_frac.shape) < s_frac)
        s = s.astype(np.int8)
        s[n] = keep
        stages = solve_r(p, s, deadline)
        if stages is None or time.perf_counter() > deadline:
            break
        events = rs_events(p, s, stages)
        if time.perf_counter() > deadline:
            break
        rep = replay(p, events)
        best.rounds += 1
        fits = rep.peak_bytes <= budget_bytes
        best.within_budget += fits
        better = (best.events is None or (fits and (best.peak > budget_bytes or rep.time < best.time))
                  or (not fits and best.peak > budget_bytes and rep.peak_bytes < best.peak))
        if better:
            best.events, best.time, best.peak, best.how = events, rep.time, rep.peak_bytes, how
    return best


def checkmate_lp(problem: Problem, *, time_limit_s: float, seed: int = 0,
                 extra: dict[str, Any] | None = None) -> Schedule:
    """Checkmate's LP relaxation (PDLP, at LP_BUDGET x the budget, LP_SHARE of the limit) and rounding (the
    rest of the limit) at ``problem.budget_bytes``: the cheapest rounded schedule that fits, else the one of
    least peak (status ``over_budget``). ``lp_status`` says whether the LP was solved (OPTIMAL) or its
    iterate at the time limit was rounded (TIME_LIMIT); ``not_built`` / ``unknown`` when there is nothing
    to round."""
    t0 = time.perf_counter()
    p, budget = problem, problem.budget_bytes
    lp_budget = p.fixed_bytes + int(LP_BUDGET * (budget - p.fixed_bytes))
    lp = solve_lp(p, lp_budget, LP_SHARE * time_limit_s)
    info = {**(extra or {}), "variant": "lp_rounding", "lp_status": lp.status, "lp_solver": lp.solver,
            "lp_variables": lp.variables, "lp_constraints": lp.constraints, "lp_budget_bytes": lp_budget,
            "lp_seconds": round(lp.wall_s, 3), "lp_objective": lp.objective_s}
    if lp.s is None:
        note = {"NOT_BUILT": f"LP ({lp.variables} variables) not built within its share of the time limit",
                "NOT_STARTED": f"LP ({lp.variables} variables) built, but too little of the time limit was left "
                               "to start PDLP"}.get(lp.status, f"LP without a solution to round ({lp.status})")
        status = "unknown" if lp.status != "NOT_BUILT" else "not_built"
        return no_schedule(budget, "checkmate", time.perf_counter() - t0, note, info, status=status)
    if lp.status != "OPTIMAL":
        info["note"] = (f"the LP was not solved ({lp.status}): PDLP's iterate at the limit is rounded, a weak "
                        "schedule; a longer time limit gives Checkmate's real rounding")
    best = round_lp(p, lp.s, budget, t0 + time_limit_s, seed)
    info["rounding"] = {"best": best.how, "rounds": best.rounds, "within_budget": best.within_budget,
                        "seconds": round(time.perf_counter() - t0 - lp.wall_s, 3)}
    if best.events is None:
        return no_schedule(budget, "checkmate", time.perf_counter() - t0,
                           "the time limit passed before a rounding finished", info, status="unknown")
    return from_events(p, best.events, method="checkmate", solve_seconds=time.perf_counter() - t0, extra=info)
