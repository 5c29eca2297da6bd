"""A tighter lower bound for small problems: each tensor's residency at each first compute."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from trainplan.schedule.bounds import Bound
from trainplan.schedule.mip import CpSatRun, _ticks, configure, time_unit, used_seconds, wall_cap
from trainplan.schedule.problem import Problem

DET_BUDGET = 1500.0  # deterministic s per s of limit: min(cap, max(0.05, DET_BUDGET / variables)) with cap 0.4 for
# plain search and 0.12 for LB tree search (its first second goes to setup: 0.1-0.2 per wall s over a 0.6-2 s
# share at 2.4-15k variables), about half to two thirds of the rate CP-SAT's clock advanced at here
STAGED_LINEARIZATION = 2  # with the full LP relaxation one worker proves 30-40-op cases in < 1 s (level 1: 6 s)
FIRST_PHASE_SHARE = 0.7  # of the time on models of <= LB_TREE_ONLY_ABOVE variables: plain search (closes them
LB_TREE_ONLY_ABOVE = 8000  # fast), then LB tree search; larger models get LB tree search only, which raises the
# bound fastest (100 ops at 1.1 x floor, 3 s: 27.5% against 21.7% without it) but closes 40-op cases in 9 s, not 1 s
CHAIN_ROWS = True  # rows for tensors kept after a chain of restores in a stage (see _add_chain_row)
MIN_SOLVE_S = 0.05  # seconds of the limit a row-generation round needs to be started


def _ranges(p: Problem) -> list[tuple[int, int]]:
    """First and last instant (first computes; ``n`` = the end) at which each tensor may be resident: its
    own compute to its last reader (``n`` for a keep op), extended to where any reader that may be
    recomputed can still need it."""
    hi = [p.n if u in p.keep_idx else max(p.users[u], default=u) for u in range(p.n)]
    for v in reversed(range(p.n)):
        if p.ops[v].recompute:
            for w in p.inputs[v]:
                hi[w] = max(hi[w], hi[v])
    return [(u, hi[u]) for u in range(p.n)]


def staged_variables(problem: Problem) -> int:
    """Size of :func:`solve_staged`'s model: up to three booleans per tensor and instant it may be held at."""
    return 3 * sum(hi - lo for lo, hi in _ranges(problem))


@dataclass(frozen=True)
class StagedSolution:
    """One solution of the staged model, per instant i (first compute of op i; ``n`` = the end): the
    tensors resident at i, recomputed in stage i, swapped in in stage i and restored a second time in stage
    i (after the restores that read them); and the tensors swapped out."""

    resident: list[frozenset[int]]
    recomputed: list[frozenset[int]]
    swapped_in: list[frozenset[int]]
    swapped_out: frozenset[int]
    restored_twice: list[frozenset[int]]


@dataclass
class _Model:
    """The staged model and its variables (``res[u][i]``, ``rc[u][i]``, ``sw[u][i]``: see :func:`solve_staged`),
    with the stages whose within-stage memory rows have been added."""

    m: cp_model.CpModel
    cap: int
    res: list[dict[int, cp_model.IntVar | int]]
    rc: list[dict[int, cp_model.IntVar]]
    sw: list[dict[int, cp_model.IntVar]]
    cost: list[cp_model.LinearExprT]
    ranges: list[tuple[int, int]]
    out: dict[int, cp_model.IntVar] = field(default_factory=dict)
    rowed: set[int] = field(default_factory=set)
    held: dict[int, tuple[dict[int, cp_model.IntVar | int], cp_model.IntVar]] = field(default_factory=dict)
    twice: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    chained: set[tuple[int, int, frozenset[int]]] = field(default_factory=set)


def _build(p: Problem, cap: int) -> _Model:
    """Residency, restore and memory rows at every first compute (no memory inside a stage yet)."""
    n, tu = p.n, time_unit(p)
    m = cp_model.CpModel()
    needed = [set(p.users[u]) | ({n} if u in p.keep_idx else set()) for u in range(n)]
    st = _Model(m, cap, [{} for _ in range(n)], [{} for _ in range(n)], [{} for _ in range(n)], [], _ranges(p))
    res, rc, sw, cost = st.res, st.rc, st.sw, st.cost
    for u, (lo, hi) in enumerate(st.ranges):
        op = p.ops[u]
        out = m.NewBoolVar(f"o{u}") if op.swap and hi > lo + 1 else None  # one swap-out before any swap-in
        if out is not None:
            st.out[u] = out
            cost.append(_ticks(p.transfer_time(u), tu) * out)
        res[u][lo] = 1
        for i in range(lo + 1, hi + 1):
            res[u][i] = 1 if i in needed[u] else m.NewBoolVar(f"R{u}_{i}")
            ways = []
            if op.recompute:
                rc[u][i] = m.NewBoolVar(f"c{u}_{i}")
                cost.append(_ticks(op.time, tu) * rc[u][i])
                ways.append(rc[u][i])
            if out is not None:
                sw[u][i] = m.NewBoolVar(f"s{u}_{i}")
                m.AddImplication(sw[u][i], out)
                cost.append(_ticks(p.transfer_time(u), tu) * sw[u][i])
                ways.append(sw[u][i])
            m.Add(res[u][i] <= res[u][i - 1] + sum(ways))
    for u in range(n):
        for i, c in rc[u].items():  # a recompute in stage i needs each input held from i-1 or restored in i
            for w in p.inputs[u]:
                m.Add(c <= sum(x for x in (res[w].get(i - 1), rc[w].get(i), sw[w].get(i)) if x is not None))
    rows: list[list[tuple[int, cp_model.IntVar | int]]] = [[] for _ in range(n)]
    for u in range(n):
        for i, r in res[u].items():
            if u < i < n and i not in needed[u]:
                rows[i].append((p.ops[u].bytes, r))
    for i, own in enumerate(p.working_sets):
        m.Add(sum(b * r for b, r in rows[i]) <= cap - own)
    return st


def _restores(p: Problem, st: _Model, i: int) -> list[tuple[cp_model.IntVar, int, set[int]]]:
    """Restores in stage i: (literal, bytes it needs on top of the held tensors, tensors it counts itself).
    A recompute needs its working set (inputs, output, workspace), a swap-in its own bytes."""
    out = []
    for u in range(p.n):
        if i in st.rc[u]:
            out.append((st.rc[u][i], p.working_sets[u], set(p.inputs[u]) | {u}))
        if i in st.sw[u]:
            out.append((st.sw[u][i], p.ops[u].bytes, {u}))
    return out


def _restore_literals(st: _Model, v: int, i: int) -> list[cp_model.IntVar]:
    """The literals that restore v in stage i (recompute, swap-in), where the model has them."""
    return [x for x in (st.rc[v].get(i), st.sw[v].get(i)) if x is not None]


def _held(st: _Model, v: int, i: int, value: Callable[[cp_model.LinearExprT], int]) -> int:
    """Whether v is held through stage i (resident at i-1 and i, not restored in stage i), under ``value``."""
    restored = any(value(x) for x in _restore_literals(st, v, i))
    return int(bool(value(st.res[v][i - 1]) and value(st.res[v][i]) and not restored))


def _live(st: _Model, i: int) -> list[int]:
    """Tensors that may be held through stage i."""
    return [v for v, (lo, hi) in enumerate(st.ranges) if lo < i <= hi]


def _held_bytes(p: Problem, st: _Model, i: int, value: Callable[[cp_model.LinearExprT], int]) -> dict[int, int]:
    """Bytes of each tensor that may be held through stage i (0 if it is not held), under ``value``."""
    return {v: p.ops[v].bytes * _held(st, v, i, value) for v in _live(st, i)}


def _violated(p: Problem, st: _Model, value: Callable[[cp_model.LinearExprT], int]) -> list[int]:
    """Stages where a restore in the solution ``value`` would not fit beside the tensors held through the stage."""
    bad = []
    for i in range(1, p.n + 1):
        if i in st.rowed:
            continue
        held = _held_bytes(p, st, i, value)
        total = sum(held.values())
        if any(value(lit) and total - sum(held.get(v, 0) for v in own) + need > st.cap
               for lit, need, own in _restores(p, st, i)):
            bad.append(i)
    return bad


def _add_stage_rows(p: Problem, st: _Model, i: int) -> None:
    """Memory inside stage i: at each restore, the tensors held through the stage plus what the restore
    needs fit the budget. ``H[v,i] >= R[v,i-1] + R[v,i] - 1 - c[v,i] - s[v,i]``; the row
    ``sum H b - (H b of the restore's own tensors) + need x lit <= cap`` holds at lit = 0 too, since the held
    tensors are resident at i."""
    m, held = st.m, {}
    for v in _live(st, i):
        restores = _restore_literals(st, v, i)
        a, b = st.res[v][i - 1], st.res[v][i]
        if isinstance(a, int) and isinstance(b, int) and not restores:
            held[v] = a * b
        else:
            held[v] = m.NewBoolVar(f"H{v}_{i}")
            m.Add(held[v] >= a + b - 1 - sum(restores))
    total = m.NewIntVar(0, st.cap, f"M{i}")
    m.Add(total == sum(p.ops[v].bytes * h for v, h in held.items()))
    for lit, need, own in _restores(p, st, i):
        m.Add(total - sum(p.ops[v].bytes * held[v] for v in own if v in held) + need * lit <= st.cap)
    st.rowed.add(i)
    st.held[i] = (held, total)


def _value(table: dict[int, cp_model.IntVar | int], i: int, value: Callable[[cp_model.LinearExprT], int]) -> int:
    """``table[i]`` under ``value``; 0 where the model has no such variable."""
    return int(value(table[i])) if i in table else 0


def _kept_chains(p: Problem, st: _Model, i: int,
                 value: Callable[[cp_model.LinearExprT], int]) -> dict[int, list[tuple[int, int, str]]]:
    """Per recompute u in stage i: the tensors z (not u's own) that the solution ``value`` restores once in
    the stage and keeps to instant i, not resident at i-1, and that an input w of u, recomputed in the stage
    (not resident at i-1, not swapped in), reads: (z, w, how z is restored). Such a z is restored before
    w's first recompute, so it is resident at u's recompute."""
    chains: dict[int, list[tuple[int, int, str]]] = {}
    for u in range(p.n):
        if not _value(st.rc[u], i, value):
            continue
        seen = set(p.inputs[u]) | {u}
        for w in p.inputs[u]:
            if not _value(st.rc[w], i, value) or _value(st.res[w], i - 1, value) or _value(st.sw[w], i, value):
                continue
            for z in p.inputs[w]:
                kinds = [k for k, table in (("rc", st.rc), ("sw", st.sw)) if _value(table[z], i, value)]
                once = len(kinds) == 1 and not ((z, i) in st.twice and value(st.twice[(z, i)]))
                if z not in seen and once and _value(st.res[z], i, value) and not _value(st.res[z], i - 1, value):
                    seen.add(z)
                    chains.setdefault(u, []).append((z, w, kinds[0]))
    return chains


def _restored_twice(p: Problem, st: _Model, z: int, i: int) -> cp_model.IntVar:
    """A literal (charged its cheapest restore) that lets a schedule restore z twice in stage i, so the
    chain rows stay valid for schedules that free z and restore it again."""
    if (z, i) not in st.twice:
        lit = st.m.NewBoolVar(f"D{z}_{i}")
        costs = [_ticks(t, time_unit(p)) for t, ok in ((p.ops[z].time, i in st.rc[z]),
                                                        (p.transfer_time(z), i in st.sw[z])) if ok]
        st.cost.append(min(costs) * lit)
        st.twice[(z, i)] = lit
    return st.twice[(z, i)]


def _chain_violations(p: Problem, st: _Model,
                      value: Callable[[cp_model.LinearExprT], int]) -> list[tuple[int, int, list[tuple[int, int, str]]]]:
    """(stage, recompute u, its chains) where u's working set, the held tensors and the kept chain tensors
    of :func:`_kept_chains` exceed the budget in the solution ``value``, and no chain row covers it yet."""
    bad = []
    for i in range(1, p.n + 1):
        kept = {u: c for u, c in _kept_chains(p, st, i, value).items()
                if (i, u, frozenset(z for z, _, _ in c)) not in st.chained}
        held = _held_bytes(p, st, i, value) if kept else {}
        for u, chains in kept.items():
            own = set(p.inputs[u]) | {u}
            memory = sum(held.values()) - sum(held.get(v, 0) for v in own) + p.working_sets[u] + \
                sum(p.ops[z].bytes for z, _, _ in chains)
            if memory > st.cap:
                bad.append((i, u, chains))
    return bad


def _add_chain_row(p: Problem, st: _Model, i: int, u: int, chains: list[tuple[int, int, str]]) -> None:
    """At recompute u in stage i the held tensors, u's working set and each chain tensor z fit the budget:
    z's term is ``b_z x (c[u] + c[w] + r_z + R[z,i] - R[w,i-1] - s[w] - R[z,i-1] - (other restore of z)
    - D[z] - 3)``, which is b_z exactly when the chain holds and <= 0 otherwise (D: z restored twice)."""
    if i not in st.held:
        _add_stage_rows(p, st, i)
    held, total = st.held[i]
    own = set(p.inputs[u]) | {u}
    terms = []
    for z, w, kind in chains:
        r, other = (st.rc[z][i], st.sw[z].get(i, 0)) if kind == "rc" else (st.sw[z][i], st.rc[z].get(i, 0))
        flag = (st.rc[u][i] + st.rc[w][i] + r + st.res[z][i] - st.res[w].get(i - 1, 0) - st.sw[w].get(i, 0)
                - st.res[z].get(i - 1, 0) - other - _restored_twice(p, st, z, i) - 3)
        terms.append(p.ops[z].bytes * flag)
    st.m.Add(total - sum(p.ops[v].bytes * held[v] for v in own if v in held)
             + p.working_sets[u] * st.rc[u][i] + sum(terms) <= st.cap)
    st.chained.add((i, u, frozenset(z for z, _, _ in chains)))


def _snapshot(p: Problem, st: _Model, value: Callable[[cp_model.LinearExprT], int]) -> StagedSolution:
    """The solution ``value`` of the staged model, as sets per instant."""
    def at(table: list[dict[int, cp_model.IntVar]] | list[dict[int, cp_model.IntVar | int]],
           i: int) -> frozenset[int]:
        return frozenset(u for u in range(p.n) if i in table[u] and value(table[u][i]))
    twice = [frozenset(z for (z, j), lit in st.twice.items() if j == i and value(lit)) for i in range(p.n + 1)]
    return StagedSolution([at(st.res, i) for i in range(p.n + 1)], [at(st.rc, i) for i in range(p.n + 1)],
                          [at(st.sw, i) for i in range(p.n + 1)],
                          frozenset(u for u, o in st.out.items() if value(o)), twice)


def solve_staged(problem: Problem, budget_bytes: int, run: CpSatRun,
                 stop_at_ticks: int | None = None) -> tuple[Bound, StagedSolution | None]:
    """Relaxation on stages (a stage is the stretch before one first compute, in program order).
    ``R[u,i]``: u resident at the first compute of op i; 1 where op i reads u. u is resident at i only
    if resident at i-1 or restored in stage i: by a recompute, whose inputs are resident at i-1 or
    restored in stage i too, or by a swap-in after one swap-out. Memory rows count every resident
    tensor at every first compute; inside a stage, each restore must fit beside the tensors held through
    the stage (rows added for the stages an optimal solution violates, then solved again: row
    generation); so is a tensor restored once in the stage and kept, at a recompute one of whose inputs
    is recomputed from it (chain rows, with a literal that pays for a second restore instead). Only one
    restore per tensor and stage is charged (two with that literal), and tensors restored and dropped
    inside a stage are not counted at other restores, so every schedule with first computes in program
    order maps onto a feasible point of no larger cost, and CP-SAT's proven bound is a lower bound.
    Unlike ``relaxation_bound`` it charges the recomputes that restoring a tensor's inputs needs (the
    cost of tight budgets); it has O(n x lifetime) variables, so it is meant for problems of up to ~100
    ops. Status ``OPTIMAL``: optimal for the staged model with every violated within-stage row added;
    ``OPTIMAL_WITHOUT_STAGE_ROWS``: stopped (time, or the bound reached ``stop_at_ticks``, the cost of a
    known schedule) with rows still to add; otherwise CP-SAT's status of the last round. Also returns the
    last round's solution (None if it found none): ``staged_events.staged_events`` may turn it into a
    schedule of the same cost. ``run``: the rounds' limit, seed and deterministic time, and ``wall_cap_s``, the
    wall time left to the whole call, if it caps the rounds (see mip.configure); each round runs one worker, without
    CP-SAT's log. The bound's ``work_s`` is the time used (mip.used_seconds)."""
    p = problem
    time_limit_s, deterministic = run.time_limit_s, run.deterministic
    wall_end = time.perf_counter() + wall_cap(time_limit_s, deterministic, run.wall_cap_s)
    if budget_bytes < p.floor_bytes:  # some op's working set (or the keep set) alone is over the budget
        return Bound(math.inf, 0, "INFEASIBLE", True), None
    tu = time_unit(p)
    const = sum(_ticks(op.time, tu) for op in p.ops)
    st = _build(p, budget_bytes - p.fixed_bytes)
    if not st.cost:
        return Bound(p.compute_time, const, "OPTIMAL"), None
    st.m.Minimize(sum(st.cost))
    extra, status, solution, used = 0, "UNKNOWN", None, 0.0
    variables = len(st.m.Proto().variables)
    # (LB tree search?, seconds): fixed shares, so a deterministic run does not depend on machine speed
    phases = ((False, FIRST_PHASE_SHARE * time_limit_s), (True, (1 - FIRST_PHASE_SHARE) * time_limit_s)) \
        if variables <= LB_TREE_ONLY_ABOVE else ((True, time_limit_s),)
    for lb_tree, left in phases:
        det_rate = min(0.12 if lb_tree else 0.4, max(0.05, DET_BUDGET / variables))
        while left > MIN_SOLVE_S and time.perf_counter() < wall_end:  # row generation stops at the wall cap too
            one_worker = CpSatRun(left, 1, run.seed, deterministic, wall_cap_s=wall_end - time.perf_counter())
            solver = configure(one_worker, det_per_second=det_rate)  # 1 worker: 2 proved far less
            solver.parameters.linearization_level = STAGED_LINEARIZATION
            solver.parameters.optimize_with_lb_tree_search = lb_tree
            code = solver.Solve(st.m)
            status = solver.StatusName(code)
            work = used_seconds(solver, left, deterministic)
            left, used = left - work, used + work
            if code == cp_model.INFEASIBLE:
                return Bound(math.inf, 0, status, True, work_s=used), None
            if code in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
                extra = max(extra, math.ceil(solver.BestObjectiveBound() - 1e-6))
            if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                solution = _snapshot(p, st, solver.Value)
            if code != cp_model.OPTIMAL:
                break
            bad = _violated(p, st, solver.Value)
            chains = _chain_violations(p, st, solver.Value) if CHAIN_ROWS else []
            if bad or chains:
                status = "OPTIMAL_WITHOUT_STAGE_ROWS"
            if not (bad or chains) or (stop_at_ticks is not None and const + extra >= stop_at_ticks):
                return Bound(p.compute_time + extra * tu, const + extra, status, work_s=used), solution
            for i in bad:
                _add_stage_rows(p, st, i)
            for i, u, chain in chains:
                _add_chain_row(p, st, i, u, chain)
            st.m.Minimize(sum(st.cost))  # with the costs of the restored-twice literals of the chain rows
    return Bound(p.compute_time + extra * tu, const + extra, status, work_s=used), solution
