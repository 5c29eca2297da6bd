"""Our CP-SAT model: interval formulation of swap + recompute on a grid of event positions.

Block i (one per op, plus a final block n) holds K_i rematerialisation slots followed, for i < n,
by the first compute of op i at a fixed position (execution order). Each op u has up to C
residency copies: copy 0 starts at u's first compute, copy k >= 1 is optional and starts in a
later slot, materialised by a recompute or a swap-in. A copy is the interval [start, end] during
which u is on the device; the cap is one cumulative constraint over all copies plus the
one-position workspace of every compute. See docs/schedule.md for the constraint families.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ortools.sat.python import cp_model

from trainplan.schedule import deadline as dl
from trainplan.schedule import lns
from trainplan.schedule.problem import Problem
from trainplan.schedule.settings import DEFAULTS

log = logging.getLogger(__name__)
Events = list[tuple[str, str]]


@dataclass
class MipResult:
    """Outcome of one CP-SAT solve; ``bound_s`` is a valid lower bound on the true step time."""

    events: Events | None
    status: str
    objective_s: float | None
    bound_s: float | None
    wall_s: float
    first_solution_s: float | None
    stats: dict[str, Any] = field(default_factory=dict)
    work_s: float = 0.0  # seconds of the limit used (see used_seconds)


@dataclass
class _Copy:
    block: int
    slot: int  # index among the block's remat slots; -1 = the block's first compute
    end: tuple[int, int]  # (block, slot) of the last event that reads it
    kind: str  # "first" | "recompute" | "swap_in"


def copies_from_events(problem: Problem, events: Events) -> tuple[list[list[_Copy]], dict[tuple[int, int, int], int], list[int]]:
    """Map a valid event list onto the grid: copies per op, covering copy per (v, copy, input) and
    the number of remat events per block. A copy ends at the last compute that read it (its free
    moved as early as possible); keep ops resident at the end are extended to the horizon later."""
    p = problem
    copies: list[list[_Copy]] = [[] for _ in p.ops]
    current: list[int | None] = [None] * p.n
    cover: dict[tuple[int, int, int], int] = {}
    used = [0] * (p.n + 1)
    block = 0
    for kind, oid in events:
        u = p.index[oid]
        if kind not in ("compute", "swap_in"):
            if kind == "free":
                current[u] = None
            continue
        first = kind == "compute" and not copies[u]
        if first:
            assert u == block, "first computes must follow program order"
            where = (block, -1)
        else:
            where = (block, used[block])
            used[block] += 1
        k = len(copies[u])
        copies[u].append(_Copy(where[0], where[1], where, "first" if first else
                               ("recompute" if kind == "compute" else "swap_in")))
        if kind == "compute":
            for w in p.inputs[u]:
                c = current[w]
                assert c is not None, "events must be replay-valid"
                copies[w][c].end = where  # events come in time order: the latest reader so far
                cover[(u, k, w)] = c
        current[u] = k
        if first:
            block += 1
    return copies, cover, used


class SearchStop:
    """Lets another thread stop a running :func:`solve_mip` (its best solution so far is kept)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._solver: cp_model.CpSolver | None = None
        self.requested = False

    def attach(self, solver: cp_model.CpSolver) -> None:
        with self._lock:
            self._solver = solver

    def stop(self) -> None:
        with self._lock:
            self.requested = True
            if self._solver is not None:
                self._solver.StopSearch()


class _FirstSolution(cp_model.CpSolverSolutionCallback):
    def __init__(self) -> None:
        super().__init__()
        self.t0 = time.perf_counter()
        self.first: float | None = None
        self.count = 0

    def on_solution_callback(self) -> None:
        if self.first is None:
            self.first = time.perf_counter() - self.t0
        self.count += 1


def _ticks(seconds: float, unit: float) -> int:
    """Seconds to integer ticks, rounded down (so the solver's bound stays a lower bound); the 1e-6
    tick slack absorbs float error such as 1 / 1e-9 = 999999999.9999999."""
    return math.floor(seconds / unit + 1e-6)


DET_PER_SECOND = 0.04  # deterministic s per wall s of limit: CP-SAT 9.15 measured ~0.05 on this 2-core host
DET_SMALL_MODEL = 400.0  # smaller models advance the clock faster (0.19 per wall s at 1.9k variables, 0.13
DET_MAX_PER_SECOND = 0.1  # at 9k, 0.01-0.05 at 19k): min(0.1, max(0.04, 400 / variables)), about half of that
LNS_ONLY_ABOVE = 60  # ops: above this, a hinted wall-clock run gives every worker to LNS (see solve_mip)
WALL_SAFETY = DEFAULTS.wall_safety  # wall-clock cap of a deterministic run, as a multiple of its share (see settings)


@dataclass(frozen=True)
class CpSatRun:
    """How one CP-SAT run runs: its limit ``time_limit_s`` (seconds of the call's limit: in a deterministic run a
    deterministic-time limit, see :func:`configure`), ``workers`` and ``seed``, ``deterministic`` time, ``verbose``
    (CP-SAT's search log), ``wall_cap_s`` (the wall time left to the whole call, if it caps the run) and, for a
    hinted :func:`solve_mip`, ``lns_share``: the share of the limit given to window LNS."""

    time_limit_s: float = 10.0
    workers: int = 2
    seed: int = 0
    deterministic: bool = True
    verbose: bool = False
    wall_cap_s: float | None = None
    lns_share: float = 0.0


def configure(run: CpSatRun, det_per_second: float = DET_PER_SECOND, interleave: bool = False) -> cp_model.CpSolver:
    """A CP-SAT solver with our limits (``run``; its ``lns_share`` is :func:`solve_mip`'s). Deterministic: one
    worker (with ``interleave``, ``workers`` subsolvers interleaved in deterministic batches) stopped on
    deterministic time, ``det_per_second`` x ``time_limit_s`` deterministic seconds (a function of the limit only,
    so the answer does not depend on machine speed or load), capped at WALL_SAFETY x ``time_limit_s`` of wall
    time, or ``wall_cap_s`` if less (the wall time left to the whole call): a safety net that keeps the limit on a
    slow or loaded machine, and only then can the answer change. Otherwise ``workers`` threads stopped on wall
    time: ``time_limit_s``, or ``wall_cap_s`` if less."""
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.random_seed = run.seed
    prm.log_search_progress = run.verbose
    prm.num_workers = max(1, run.workers) if not run.deterministic or interleave else 1
    prm.interleave_search = run.deterministic and interleave and run.workers > 1
    if run.deterministic:
        prm.max_deterministic_time = det_per_second * run.time_limit_s
    prm.max_time_in_seconds = max(0.05, wall_cap(run.time_limit_s, run.deterministic, run.wall_cap_s))
    return solver


def wall_cap(time_limit_s: float, deterministic: bool, wall_cap_s: float | None = None) -> float:
    """Wall-clock seconds a run with this limit may take: WALL_SAFETY x the limit in a deterministic run (a
    safety net), the limit otherwise; never more than ``wall_cap_s`` (the wall time left to the whole call)."""
    cap = (WALL_SAFETY if deterministic else 1.0) * time_limit_s
    return cap if wall_cap_s is None else min(cap, wall_cap_s)


def used_seconds(solver: cp_model.CpSolver, time_limit_s: float, deterministic: bool) -> float:
    """Seconds of ``time_limit_s`` a finished solve used: its wall time, or in a deterministic run its share of
    the deterministic limit times ``time_limit_s``. The latter depends on the model and the limits only, so
    the time left for later steps, and with it their answers, is the same on any machine."""
    if not deterministic:
        return solver.WallTime()
    limit = solver.parameters.max_deterministic_time
    return time_limit_s * min(1.0, solver.ResponseProto().deterministic_time / limit) if limit > 0 else 0.0


def objective_ticks(problem: Problem, events: Events) -> int:
    """A schedule's cost in the model's objective ticks: every compute and transfer rounded down to whole
    ticks, as in :func:`solve_mip` and ``bounds.relaxation_bound`` (so ticks <= that bound proves it optimal)."""
    tu = time_unit(problem)
    total = 0
    for kind, oid in events:
        u = problem.index[oid]
        if kind == "compute":
            total += _ticks(problem.ops[u].time, tu)
        elif kind in ("swap_in", "swap_out"):
            total += _ticks(problem.transfer_time(u), tu)
    return total


def det_per_second(variables: int) -> float:
    """Deterministic seconds per second of limit for a model of ``variables``: a function of the model only
    (so runs stay reproducible), set to about half the rate CP-SAT's clock advances at on this host."""
    return min(DET_MAX_PER_SECOND, max(DET_PER_SECOND, DET_SMALL_MODEL / max(1, variables)))


def time_unit(problem: Problem) -> float:
    """Objective tick in seconds: 1 ns, coarsened by 10x until n x the worst per-op cost stays < 2^50."""
    worst = max(64, problem.n) * sum(op.time + 2 * problem.transfer_time(u) for u, op in enumerate(problem.ops))
    unit = 1e-9
    while worst / unit > 2**50:
        unit *= 10
    return unit


def byte_unit(cap: int) -> int:
    """Bytes per memory unit, so the capacity fits in 2^30 units; demands are rounded up."""
    return max(1, math.ceil(cap / 2**30))


MAX_MODEL_VARIABLES = 250_000  # 3-6 s of model building on this host (12-22 us per variable)
BUILD_SECONDS_PER_VARIABLE = 25e-6  # a model is built only if this x its size fits in the wall time left,
LOAD_SECONDS_PER_VARIABLE = 20e-6  # plus this x its size: CP-SAT's load and presolve start, which its time limit
# does not interrupt (0.76 s for a 47k-variable model on this host under load)


def model_variables(problem: Problem, ncop: list[int]) -> int:
    """The model's variable count, to within a few percent: six per copy (start, end, length, presence,
    recompute, swap-in) and one cover literal per (compute event, input, input copy)."""
    covers = sum((1 + (ncop[v] - 1 if op.recompute else 0)) * sum(ncop[w] for w in problem.inputs[v])
                 for v, op in enumerate(problem.ops))
    return 6 * sum(ncop) + covers


def hint_growth(problem: Problem, hint: Events, copies: int | None = None) -> float:
    """How many times the variables (see :func:`model_variables`) of the model :func:`solve_mip` builds for
    ``hint`` exceed those of its model without a hint: the grid's growth to fit the hint."""
    hint_copies, _, used = copies_from_events(problem, hint)
    grown = _grid(problem, copies, None, hint_copies, used, None).ncop
    plain = _grid(problem, copies, None, None, [], None).ncop
    return model_variables(problem, grown) / max(1, model_variables(problem, plain))


@dataclass
class _Grid:
    """Positions of the model: K[i] remat slots then (i < n) op i's first compute per block i, copies per op."""

    copies: int  # the most copies any op has (C, or more to fit a hint)
    slots: list[int]  # K per block
    base: list[int]  # first position of each block
    horizon: int  # H
    fpos: list[int]  # position of each op's first compute
    ncop: list[int]  # copies of each op (1 where it may not be rematerialised)


def _grid(p: Problem, copies: int | None, slots: int | None, hint_copies: list[list[_Copy]] | None,
          hint_used: list[int], remat_ops: frozenset[int] | None) -> _Grid:
    """The grid for C copies per op and K slots per block (defaults in :func:`solve_mip`), raised to fit the
    hint: each op's copies to as many as the hint holds it, each block's slots to as many as the hint uses.
    Only ``remat_ops`` (default: every op) get copies beyond the first. ``copies`` of the grid is the most any
    op has."""
    n = p.n
    C = copies or (3 if n <= 60 else 2)
    per_op = [C] * n
    K = [slots or (n if n <= 60 else 2)] * (n + 1)
    if hint_copies is not None:
        per_op = [max(C, len(c)) for c in hint_copies]
        K = [max(k, c) for k, c in zip(K, hint_used)]
    K = [0 if b < n and p.ops[b].of is not None else k for b, k in enumerate(K)]  # outputs taken at once
    base = [0] * (n + 1)
    for b in range(1, n + 1):
        base[b] = base[b - 1] + K[b - 1] + 1
    ncop = [per_op[u] if (op.recompute or op.swap) and (remat_ops is None or u in remat_ops) else 1
            for u, op in enumerate(p.ops)]
    return _Grid(max(ncop, default=1), K, base, base[n] + K[n], [base[i] + K[i] for i in range(n)], ncop)


@dataclass
class _CpModel:
    """The CP-SAT model and its variables, per op u and copy k: start ``s``, end ``e``, length ``size``,
    presence ``pres``, recompute ``rc`` / swap-in ``sw`` literals (None for copy 0 or a forbidden way),
    ``out`` (one swap-out), ``zs`` (copy resident at the end, keep ops), ``ys`` (copy c of input w covers
    compute k of v)."""

    m: cp_model.CpModel
    s: list[list[Any]]
    e: list[list[Any]]
    size: list[list[Any]]
    pres: list[list[Any]]
    rc: list[list[Any]]
    sw: list[list[Any]]
    out: list[Any]
    zs: dict[int, list[Any]]
    ys: dict[tuple[int, int, int, int], Any]


def _build(p: Problem, g: _Grid, cap: int, bu: int, lower_bound_ticks: int, stop: dl.Deadline = dl.NEVER) -> _CpModel:
    """The constraint families of docs/schedule.md: copies (recompute or swap-in, ordered, disjoint), one
    event per position, the memory cap (cumulative, in units of ``bu`` bytes), inputs covered, keep ops resident at
    the end; the objective in ticks of :func:`time_unit`. Raises deadline.OutOfTime once ``stop`` passes."""
    n, H, fpos, ncop, tu = p.n, g.horizon, g.fpos, g.ncop, time_unit(p)
    m = cp_model.CpModel()
    true = m.NewConstant(1)
    # a remat copy starts in a slot after the op's first compute; first computes occupy their own
    # positions in the no-overlap below, so slots need no holed domains (slow to presolve)
    s = [[m.NewConstant(fpos[u])] + [m.NewIntVar(g.base[u + 1], H - 1, f"s{u}_{k}") for k in range(1, ncop[u])]
         for u in range(n)]
    e = [[m.NewIntVar(fpos[u] if k == 0 else 0, H - 1, f"e{u}_{k}") for k in range(ncop[u])] for u in range(n)]
    size = [[m.NewIntVar(1, H, f"l{u}_{k}") for k in range(ncop[u])] for u in range(n)]
    pres: list[list[Any]] = [[true] for _ in range(n)]
    rc: list[list[Any]] = [[None] for _ in range(n)]
    sw: list[list[Any]] = [[None] for _ in range(n)]
    out: list[Any] = [None] * n
    zs: dict[int, list[Any]] = {}
    mem_iv, mem_dem, ws_iv, ws_dem, remat_iv = [], [], [], [], []
    objective = []
    for u, op in enumerate(p.ops):
        stop.check()
        ct, xt = _ticks(op.time, tu), _ticks(p.transfer_time(u), tu)
        objective.append(ct)
        if ncop[u] > 1 and op.swap:
            out[u] = m.NewBoolVar(f"out{u}")  # result kept on host (one swap-out)
            objective.append(xt * out[u])
        for k in range(ncop[u]):
            if k:
                pres[u].append(m.NewBoolVar(f"p{u}_{k}"))
                rc[u].append(m.NewBoolVar(f"rc{u}_{k}") if op.recompute else None)
                sw[u].append(m.NewBoolVar(f"sw{u}_{k}") if op.swap else None)
                m.Add(sum(x for x in (rc[u][k], sw[u][k]) if x is not None) == pres[u][k])  # recompute or swap-in
                m.AddImplication(pres[u][k], pres[u][k - 1])  # symmetry: copies used in order
                m.Add(s[u][k] >= e[u][k - 1] + 1).OnlyEnforceIf(pres[u][k])  # disjoint, ordered copies
                if rc[u][k] is not None:
                    objective.append(ct * rc[u][k])
                if sw[u][k] is not None:
                    m.AddImplication(sw[u][k], out[u])  # swap-in needs the host copy
                    objective.append(xt * sw[u][k])
                remat_iv.append(m.NewOptionalFixedSizeIntervalVar(s[u][k], 1, pres[u][k], f"v{u}_{k}"))
            mem_iv.append(m.NewOptionalIntervalVar(s[u][k], size[u][k], e[u][k] + 1, pres[u][k], f"m{u}_{k}"))
            mem_dem.append(math.ceil(op.bytes / bu))
            if op.workspace and (k == 0 or rc[u][k] is not None):
                ws_iv.append(m.NewOptionalFixedSizeIntervalVar(s[u][k], 1, true if k == 0 else rc[u][k], f"w{u}_{k}"))
                ws_dem.append(math.ceil(op.workspace / bu))
        if u in p.keep_idx:  # result on device at the end: the last copy reaches the horizon
            z = zs[u] = [m.NewBoolVar(f"z{u}_{k}") for k in range(ncop[u])]
            for k, zk in enumerate(z):
                m.Add(e[u][k] == H - 1).OnlyEnforceIf(zk)
                m.AddImplication(zk, pres[u][k])
            m.AddBoolOr(z)
    if remat_iv:  # one event per position
        m.AddNoOverlap(remat_iv + [m.NewFixedSizeIntervalVar(f, 1, f"f{i}") for i, f in enumerate(fpos)])
    m.AddCumulative(mem_iv + ws_iv, mem_dem + ws_dem, cap // bu)  # device-memory capacity

    ys: dict[tuple[int, int, int, int], Any] = {}
    for v in range(n):  # a compute needs every input resident: some copy of w covers it
        stop.check()
        for k in range(ncop[v]):
            if k and rc[v][k] is None:
                continue
            for w in p.inputs[v]:
                lits = []
                for c in range(ncop[w]):
                    y = m.NewBoolVar(f"y{w}_{c}_{v}_{k}")
                    if c:
                        m.AddImplication(y, pres[w][c])
                        m.Add(s[w][c] + 1 <= s[v][k]).OnlyEnforceIf(y)
                    elif k:
                        m.Add(s[v][k] >= fpos[w] + 1).OnlyEnforceIf(y)
                    m.Add(e[w][c] >= s[v][k]).OnlyEnforceIf(y)
                    ys[(w, c, v, k)] = y
                    lits.append(y)
                m.AddBoolOr(lits if k == 0 else lits + [rc[v][k].Not()])
    if n <= 200:  # on big graphs these rows cost more presolve time than they give
        _add_live_set_cuts(m, p, ys, cap // bu, bu)
    m.Add(sum(objective) >= lower_bound_ticks)
    m.Minimize(sum(objective))
    return _CpModel(m, s, e, size, pres, rc, sw, out, zs, ys)


def _add_hint(p: Problem, g: _Grid, v: _CpModel, hint_copies: list[list[_Copy]],
              hint_cover: dict[tuple[int, int, int], int]) -> None:
    """The hint schedule as a complete solution hint: every copy's position, way and cover literals."""
    H, fpos, m = g.horizon, g.fpos, v.m

    def pos(bs: tuple[int, int]) -> int:
        return fpos[bs[0]] if bs[1] < 0 else g.base[bs[0]] + bs[1]

    for u in range(p.n):
        cs = hint_copies[u]
        for k in range(g.ncop[u]):
            c = cs[k] if k < len(cs) else None
            start = pos((c.block, c.slot)) if c else (fpos[u] if k == 0 else 0)
            end = H - 1 if (c and u in p.keep_idx and k == len(cs) - 1) else (pos(c.end) if c else start)
            if k:
                m.AddHint(v.s[u][k], start if c else g.base[u + 1])
                m.AddHint(v.pres[u][k], c is not None)
                if v.rc[u][k] is not None:
                    m.AddHint(v.rc[u][k], c is not None and c.kind == "recompute")
                if v.sw[u][k] is not None:
                    m.AddHint(v.sw[u][k], c is not None and c.kind == "swap_in")
                if not c:
                    end = start = 0
            m.AddHint(v.e[u][k], end)
            m.AddHint(v.size[u][k], end - start + 1)
        if v.out[u] is not None:
            m.AddHint(v.out[u], any(c.kind == "swap_in" for c in cs))
        for k, zk in enumerate(v.zs.get(u, [])):
            m.AddHint(zk, k == len(cs) - 1)
    for (w, c, vv, k), y in v.ys.items():
        m.AddHint(y, hint_cover.get((vv, k, w)) == c)


@dataclass(frozen=True)
class ModelSpec:
    """What :func:`solve_mip`'s model holds beside the problem and the budget. ``hint``: a schedule given as a
    complete solution hint. ``copies`` (C) bounds residency periods per op and ``slots`` (K) remat events per block
    (defaults: C = 3, K = n up to 60 ops, else C = 2, K = 2; both raised to fit the hint). ``lower_bound_ticks``: a
    proven bound in objective ticks (from bounds.relaxation_bound) added as a constraint, so CP-SAT can close the
    gap. ``remat_ops``: only these ops may have copies beyond the first (default: every op); a restricted model,
    exact only within that restriction (not with a hint)."""

    hint: Events | None = None
    copies: int | None = None
    slots: int | None = None
    lower_bound_ticks: int = 0
    remat_ops: frozenset[int] | None = None


def solve_mip(problem: Problem, budget_bytes: int, run: CpSatRun = CpSatRun(), spec: ModelSpec = ModelSpec(),
              stop: SearchStop | None = None) -> MipResult:
    """Build and solve the CP-SAT model of ``spec``; decode the best solution into events.

    ``run``: see :func:`configure`; its ``wall_cap_s`` counts the model build too, and with ``lns_share`` and a
    hint the search stops after (1 - ``lns_share``) of the limit and window LNS (:mod:`trainplan.schedule.lns`)
    improves its solution for the rest; from scratch the search keeps the whole limit. ``stop``: lets another
    thread end the search early (``stats["stopped"]``).
    """
    t0 = time.perf_counter()
    time_limit_s, deterministic, lns_share = run.time_limit_s, run.deterministic, run.lns_share
    hint, remat_ops = spec.hint, spec.remat_ops
    ambient = dl.current().left()  # the call's deadline (inf in a worker thread, which passes wall_cap_s)
    wall_cap_s = ambient if run.wall_cap_s is None else min(run.wall_cap_s, ambient)
    p, n = problem, problem.n
    cap = budget_bytes - p.fixed_bytes
    if cap < 0:
        return MipResult(None, "INFEASIBLE", None, None, time.perf_counter() - t0, None,
                         {"note": "fixed_bytes exceed the budget"})
    if hint and remat_ops is not None:
        raise ValueError("a hint may rematerialise any op: it cannot be combined with remat_ops")
    hint_copies, hint_cover, used = copies_from_events(p, hint) if hint else (None, {}, [])
    g = _grid(p, spec.copies, spec.slots, hint_copies, used, remat_ops)
    tu, bu = time_unit(p), byte_unit(cap)
    size_estimate = model_variables(p, g.ncop)
    if size_estimate > MAX_MODEL_VARIABLES:  # e.g. a hint with hundreds of recomputes of one op
        note = f"model not built: about {size_estimate} variables > {MAX_MODEL_VARIABLES} ({g.copies} copies per op)"
        log.info("mip %s", note)
        return MipResult(None, "SKIPPED", None, None, time.perf_counter() - t0, None,
                         {"copies": g.copies, "slots": max(g.slots), "note": note})
    # the run's wall-clock end, model build and LNS included: the call's deadline, or the cap if sooner (a worker
    # thread does not see the call's deadline: its caller passes wall_cap_s)
    run_end = dl.current().earlier(t0 + wall_cap(time_limit_s, deterministic, wall_cap_s))
    if size_estimate * (BUILD_SECONDS_PER_VARIABLE + LOAD_SECONDS_PER_VARIABLE) > run_end.left():
        note = f"model not built: about {size_estimate} variables do not fit in {max(0.0, run_end.left()):.2f} s"
        return MipResult(None, "SKIPPED", None, None, time.perf_counter() - t0, None,
                         {"copies": g.copies, "slots": max(g.slots), "note": note})
    try:
        model = _build(p, g, cap, bu, spec.lower_bound_ticks, run_end)
        if hint_copies is not None:
            _add_hint(p, g, model, hint_copies, hint_cover)
    except dl.OutOfTime:
        return MipResult(None, "SKIPPED", None, None, time.perf_counter() - t0, None,
                         {"copies": g.copies, "slots": max(g.slots), "note": "model building stopped at the deadline"})
    m = model.m

    build_s = time.perf_counter() - t0  # the model build counts against the wall-clock limit
    variables = len(m.Proto().variables)
    if variables * LOAD_SECONDS_PER_VARIABLE > run_end.left():  # the build took longer than estimated
        return MipResult(None, "SKIPPED", None, None, time.perf_counter() - t0, None,
                         {"copies": g.copies, "slots": max(g.slots), "variables": variables,
                          "note": f"built in {build_s:.2f} s; no time left to load it"})
    # with lns_share and a hint (a solution from the start), window LNS takes over after (1 - lns_share) of
    # the limit; from scratch the search keeps the whole limit (split, it found less on the 100-op layered DAGs)
    first_s = time_limit_s * (1.0 - lns_share) if hint_copies is not None else time_limit_s

    load_s = variables * LOAD_SECONDS_PER_VARIABLE  # loading the model and its hint, before any search

    def make_solver(seconds: float) -> cp_model.CpSolver:
        wall_left = wall_cap(time_limit_s, deterministic, wall_cap_s) - (time.perf_counter() - t0)
        solver = configure(replace(run, time_limit_s=seconds, wall_cap_s=wall_left), det_per_second(variables),
                           interleave=True)
        # a wall cap that ends while the model and its complete hint load leaves nothing to search: allow for
        # the load (CP-SAT 9.15 aborted the process twice, in a 2000-op LNS run near the deadline)
        solver.parameters.max_time_in_seconds = max(0.05, min(solver.parameters.max_time_in_seconds + load_s,
                                                              wall_left))
        if hint_copies is not None and not deterministic and n > LNS_ONLY_ABOVE:
            # the hint is a complete solution and proofs come from the relaxation bound, so every worker
            # improves it: on 100-op graphs this proved 26 of 32 runs within 9.5 s, the default portfolio 21
            solver.parameters.use_lns_only = True
        if n > 200:  # probing and symmetry detection dominate presolve on big models; the hint gives a solution
            solver.parameters.cp_model_probing_level = 0
            solver.parameters.symmetry_level = 0
            # building max_lp's LP (cuts of the cumulative) took ~1 s of wall time and ~1 ms of deterministic
            # time in each LNS window of a 500-op layered DAG: the deterministic limit never saw it, and windows
            # ran 1 s each instead of 0.05-0.3 s
            solver.parameters.ignore_subsolvers.append("max_lp")
        return solver

    solver = make_solver(first_s)
    cb = _FirstSolution()
    if stop is not None:
        stop.attach(solver)  # a stop requested before Solve starts its search is missed: it only costs time
    code = solver.Solve(m, cb)
    work = used_seconds(solver, first_s, deterministic) if deterministic else time.perf_counter() - t0
    stopped = stop is not None and stop.requested
    if lns_share > 0 and code == cp_model.UNKNOWN and not stopped and time_limit_s - work > lns.MIN_WINDOW_S:
        solver = make_solver(time_limit_s - work)  # no solution yet: the whole model gets the rest
        code = solver.Solve(m, cb)
        work += used_seconds(solver, time_limit_s - work, deterministic) if deterministic else solver.WallTime()
    status = solver.StatusName(code)
    values: Any = solver
    if lns_share > 0 and code == cp_model.FEASIBLE and not stopped and time_limit_s - work > lns.MIN_WINDOW_S:
        lns_run = lns.LnsRun(time_limit_s - work, make_solver, deterministic, run.seed, stop, load_s, run_end)
        found = lns.improve(model, g, list(solver.ResponseProto().solution), round(solver.ObjectiveValue()), lns_run,
                            inputs=p.inputs)
        work += found.work_s
        values = _Values(found.solution)
        lns_stats = {"windows": found.windows, "improved": found.improved, "sweeps": found.sweeps,
                     "op_sets": found.op_sets, "op_improved": found.op_improved,
                     "objective_before": solver.ObjectiveValue() * tu, "objective": found.objective * tu}
    else:
        lns_stats = None
    wall = time.perf_counter() - t0
    stats = {"copies": g.copies, "slots": g.slots[0], "positions": g.horizon,
             "remat_ops": n if remat_ops is None else len(remat_ops), "time_unit_s": tu, "byte_unit": bu,
             "build_seconds": round(build_s, 3), "variables": len(m.Proto().variables),
             "constraints": len(m.Proto().constraints), "solutions": cb.count, "deterministic": deterministic,
             "deterministic_seconds": round(solver.ResponseProto().deterministic_time, 3),
             "stopped": stop is not None and stop.requested, "lns": lns_stats}
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        obj = solver.ObjectiveValue() * tu if lns_stats is None else lns_stats["objective"]
        bnd = solver.BestObjectiveBound() * tu
        log.info("mip %s objective %.6g s bound %.6g s wall %.2f s", status, obj, bnd, wall)
        events = _decode(p, values, g.horizon, model)
        return MipResult(events, status, obj, bnd, wall, None if cb.first is None else cb.first + build_s, stats,
                         work)
    log.info("mip %s after %.2f s", status, wall)
    bound = solver.BestObjectiveBound() * tu if code == cp_model.UNKNOWN else None
    return MipResult(None, status, None, bound, wall, None, stats, work)


def _add_live_set_cuts(m: cp_model.CpModel, p: Problem, ys: dict, cap_units: int, bu: int) -> None:
    """Redundant linear memory rows that give the LP relaxation the eviction trade-off.

    At the first compute of op i, every u < i still read by a first compute v >= i is on the
    device if its first copy serves the next such v (literal y[u,0,v,0]), so
    sum_u ceil(b_u) * y[u,0,next_v(u,i),0] + ceil(b_i) + ceil(ws_i) <= cap is valid. Rows that
    cannot bind (the whole live set fits) are skipped.
    """
    live: dict[int, int] = {}  # u -> next first-compute reader v >= i
    nexts = [iter(users) for users in p.users]
    heads = [next(it, None) for it in nexts]
    for i in range(p.n):
        for u in p.inputs[i]:
            live[u] = i
        op = p.ops[i]
        own = math.ceil(op.bytes / bu) + math.ceil(op.workspace / bu)
        terms = [(math.ceil(p.ops[u].bytes / bu), ys[(u, 0, v, 0)]) for u, v in live.items()]
        if sum(b for b, _ in terms) + own > cap_units:
            m.Add(sum(b * y for b, y in terms) + own <= cap_units)
        for u in p.inputs[i]:  # advance u to its next reader after i, or retire it
            while heads[u] is not None and heads[u] <= i:
                heads[u] = next(nexts[u], None)
            if heads[u] is None:
                del live[u]
            else:
                live[u] = heads[u]
        if p.users[i]:
            live[i] = p.users[i][0]


class _Values:
    """A solution vector read like a solver (``Value``, ``BooleanValue``), for :func:`_decode`."""

    def __init__(self, solution: list[int]) -> None:
        self.solution = solution

    def Value(self, var: Any) -> int:  # noqa: N802 (CP-SAT's spelling)
        return self.solution[var.Index()]

    def BooleanValue(self, var: Any) -> bool:  # noqa: N802
        return bool(self.solution[var.Index()])


def _decode(p: Problem, solver: cp_model.CpSolver | _Values, H: int, model: _CpModel) -> Events:
    """Events by position: the compute/swap-in, the first copy's swap-out, then frees of copies ending there."""
    s, e, pres, rc, out = model.s, model.e, model.pres, model.rc, model.out
    at: dict[int, tuple[str, int]] = {}
    outs: set[int] = set()
    frees: dict[int, list[int]] = {}
    for u in range(p.n):
        for k in range(len(s[u])):
            if k and not solver.BooleanValue(pres[u][k]):
                continue
            kind = "compute" if k == 0 or (rc[u][k] is not None and solver.BooleanValue(rc[u][k])) else "swap_in"
            start, end = solver.Value(s[u][k]), solver.Value(e[u][k])
            at[start] = (kind, u)
            if k == 0 and out[u] is not None and solver.BooleanValue(out[u]):
                outs.add(start)
            if not (end == H - 1 and u in p.keep_idx):
                frees.setdefault(end, []).append(u)
    events: Events = []
    for pos in range(H):
        if pos in at:
            kind, u = at[pos]
            events.append((kind, p.ops[u].id))
            if pos in outs:
                events.append(("swap_out", p.ops[u].id))
        events.extend(("free", p.ops[u].id) for u in sorted(frees.get(pos, [])))
    return events
