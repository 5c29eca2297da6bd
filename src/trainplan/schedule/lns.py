"""Large-neighbourhood search on the schedule: CP-SAT re-solves a neighbourhood of the incumbent (a window
of the program order, or a set of ops), every residency period outside it fixed to the incumbent.

The model of :mod:`trainplan.schedule.mip` is built once; each neighbourhood solves it with the variables of
the copies (residency periods) outside the neighbourhood fixed to the incumbent's values, hinted with the
incumbent (so it never makes it worse): on models of more than ``SUBMODEL_ABOVE`` variables as a sub-model of the
free variables alone (:mod:`trainplan.schedule.submodel`, one CP-SAT worker in a deterministic run), below as a
clone of the whole model. Windows of ``WINDOW_BLOCKS`` first computes slide over the order by
half a window; a sweep that improves nothing doubles the window. After each sweep, and whenever EASY_RUN windows
in a row were proven optimal at once without a gain (a round spending the time they did not need and ending
after EASY_RUN without a gain), *op neighbourhoods* free
every copy of up to ``OP_SET`` ops over the whole order (a rematerialised op, its inputs, and the
rematerialised ops nearest its recomputes in time), so a tensor kept in one place can pay for a recompute far
away, which no window holds: as many as the sweep had windows (at least ``2 x OP_IDLE``), ending after
``OP_IDLE`` in a row without a gain. Sweeps repeat until one over the whole order and its op neighbourhoods
improve nothing, or the time is up. Every answer satisfies the whole model, so it is a valid schedule.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from trainplan.schedule import deadline as dl
from trainplan.schedule.submodel import Reducer

log = logging.getLogger(__name__)

WINDOW_BLOCKS = 40  # first computes per window (the sub-model frees about this many ops' periods)
MIN_WINDOW_S = 0.05  # a window starts only with at least this much of the limit left
OP_SET = 40  # ops freed per op neighbourhood
OP_IDLE = 10  # a round of op neighbourhoods ends after this many in a row improve nothing
SUBMODEL_ABOVE = 8000  # variables: above, a neighbourhood solves a sub-model of its free variables alone; below,
# a clone of the whole model with the rest fixed. On 500-2000-op layered DAGs at 80% (9k-38k variables, 60 s)
# sub-models cost 0.04-0.3 s a neighbourhood where clones took 0.1-9 s, and gave 3.05/5.04/7.41% against
# 3.16/6.34/8.05% on 500 ops and 7.06-7.36% against 7.44% on 2000-op seed 0; on 100-250 ops (2k-5k variables),
# where a clone loads in milliseconds, they found less in 6 of 19 runs and more in 1 (CP-SAT takes another path
# through the same neighbourhood: 100-op seed 1 at 80%, 24.2% against 12.3%)
SECONDS_PER_ITEM = 1e-5  # building and loading a sub-model, per constraint read or written, which a deterministic
# run charges to its limit on top of the search's deterministic time (medians 0.8-1.25e-5 s per item, measured
# on 500- and 2000-op layered DAGs on this host): so that the limit, not the wall clock, ends the search where
# the limit fits the call
READ_SECONDS_PER_VARIABLE = 4e-5  # reading a model for its sub-models (Reducer, _Copies): 0.7 s for 38k variables on
# this host, twice that; LNS does not start on a big model with less of the call's time left
EASY_SHARE = 0.1  # a window proven optimal in less than this share of its time was too easy to hold a gain
EASY_RUN = 5  # so many such windows in a row, none improving, bring a round of op neighbourhoods forward: on a
# 2000-op layered DAG at 80% every window was proven in ~0.5% of its time, a sweep (~100 windows) never ended in
# the time left, and so no op neighbourhood ran, while about half of them improve there (60 s: 15.13% -> 14.9%)


@dataclass
class LnsResult:
    """The best solution vector (one value per model variable), its objective, and what the search did."""

    solution: list[int]
    objective: int
    windows: int
    improved: int
    sweeps: int
    op_sets: int  # op neighbourhoods tried
    op_improved: int
    work_s: float  # seconds of the limit used (deterministic: from each window's deterministic clock)


@dataclass(frozen=True)
class LnsRun:
    """How window LNS runs: ``time_limit_s`` seconds of the limit; ``make_solver(seconds)`` returns a configured
    CP-SAT solver for one neighbourhood; ``deterministic`` (each neighbourhood's time read from its deterministic
    clock); ``seed`` draws the op neighbourhoods; ``stop`` (a mip.SearchStop) ends it when requested; it ends at
    ``deadline`` (default: the call's), or less than ``load_s`` (the model's load time) before it."""

    time_limit_s: float
    make_solver: Callable[[float], cp_model.CpSolver]
    deterministic: bool
    seed: int = 0
    stop: Any = None
    load_s: float = 0.0
    deadline: dl.Deadline | None = None


@dataclass(frozen=True)
class Neighbourhood:
    """What one neighbourhood may change: per op and copy, whether the copy is ``free``; an absent free copy may
    start only in positions [lo, hi)."""

    free: list[list[bool]]
    lo: int
    hi: int


def _windows(n: int, base: list[int], horizon: int, blocks: int = WINDOW_BLOCKS) -> list[tuple[int, int]]:
    """Position ranges [lo, hi) of the windows: ``blocks`` blocks, every half window."""
    step = max(1, blocks // 2)
    out = []
    for a in range(0, n + 1, step):
        b = a + blocks
        out.append((base[a], horizon if b > n else base[b]))
        if b > n:
            break
    return out


def _free_copies(model, fpos: list[int], solution: list[int], lo: int, hi: int) -> list[list[bool]]:
    """Per op and copy, whether the window may change it: a present copy overlapping [lo, hi), or an absent
    copy of an op computed before ``hi`` (it may then start in the window, after the op's present copies)."""
    free = []
    for u, starts in enumerate(model.s):
        row = []
        for k in range(len(starts)):
            if k == 0 or solution[model.pres[u][k].Index()] == 1:
                row.append(solution[starts[k].Index()] < hi and solution[model.e[u][k].Index()] >= lo)
            else:
                row.append(fpos[u] < hi)
        free.append(row)
    return free


def _set_domain(proto, index: int, lo: int, hi: int) -> None:
    domain = proto.variables[index].domain
    domain.clear()
    domain.extend([lo, hi])


def _fix(proto, index: int, value: int) -> None:
    _set_domain(proto, index, value, value)


def _op_free(model, ops: set[int]) -> list[list[bool]]:
    """Per op and copy, whether an op neighbourhood may change it: every copy of the ops in ``ops``."""
    return [[u in ops] * len(starts) for u, starts in enumerate(model.s)]


def _op_set(model, inputs: list[list[int]], solution: list[int], seed_op: int) -> set[int]:
    """``seed_op``, its inputs, then the rematerialised ops whose copies overlap the seed's copies in time
    (nearest first), up to OP_SET ops."""
    def periods(u: int) -> list[tuple[int, int]]:
        return [(solution[model.s[u][k].Index()] if k else -1, solution[model.e[u][k].Index()])
                for k in range(len(model.s[u])) if k == 0 or solution[model.pres[u][k].Index()] == 1]

    chosen = {seed_op, *inputs[seed_op][:OP_SET - 1]}
    spans = periods(seed_op)[1:]  # the seed's rematerialised periods
    near = []
    for u in _rematerialised(model, solution):
        if u in chosen:
            continue
        dist = min((max(0, a - e, s - b) for s, e in periods(u) for a, b in spans), default=None)
        if dist is not None:
            near.append((dist, u))
    for _, u in sorted(near)[:max(0, OP_SET - len(chosen))]:
        chosen.add(u)
    return chosen


def _rematerialised(model, solution: list[int]) -> list[int]:
    """Ops with a present copy beyond the first (recomputed or swapped in) in ``solution``."""
    return [u for u, starts in enumerate(model.s)
            if any(solution[model.pres[u][k].Index()] == 1 for k in range(1, len(starts)))]


def _sub_model(model, copies: _Copies, hood: Neighbourhood, solution: list[int]) -> tuple[cp_model.CpModel, int]:
    """A copy of the model with every copy the neighbourhood does not free fixed to the incumbent, absent free
    copies allowed to start only in [lo, hi), and the incumbent as hint; the count of free copies (0: nothing to
    re-solve)."""
    sub = model.m.Clone()
    proto = sub.Proto()
    n_free = 0
    for u, row in enumerate(hood.free):
        for k, is_free in enumerate(row):
            if not is_free:
                for v in copies.own[(u, k)]:
                    _fix(proto, v, solution[v])
            elif _absent(model, solution, u, k):
                start = model.s[u][k].Index()
                window = _start_window(list(proto.variables[start].domain), hood.lo, hood.hi)
                if window is None:
                    for x in copies.lits[(u, k)]:
                        _fix(proto, x, 0)
                else:
                    _set_domain(proto, start, *window)
                    n_free += 1
            else:
                n_free += 1
        if model.out[u] is not None and not any(row):
            _fix(proto, model.out[u].Index(), solution[model.out[u].Index()])
    sub.ClearHints()
    hint = proto.solution_hint
    hint.vars.extend(range(len(proto.variables)))
    hint.values.extend(solution)
    return sub, n_free


def _absent(model, solution: list[int], u: int, k: int) -> bool:
    """Copy k of op u is absent from the incumbent (copy 0, the first compute, is always present)."""
    return bool(k) and solution[model.pres[u][k].Index()] == 0


def _start_window(domain, lo: int, hi: int) -> tuple[int, int] | None:
    """Where an absent copy with start ``domain`` (CP-SAT's flat domain, as a list: the proto's field reads 0 at
    [-1]) may start in a neighbourhood of [lo, hi): the bounds of both, or None where they do not meet (the copy
    stays absent)."""
    start_lo, start_hi = max(lo, domain[0]), min(hi - 1, domain[-1])
    return None if start_lo > start_hi else (start_lo, start_hi)


class _Copies:
    """Per copy (op, copy) of the model, its own variables (its literals among them) and the cover literals that
    name it (as input or as compute), by index: what a neighbourhood fixes or frees with the copy."""

    def __init__(self, model) -> None:
        self.own: dict[tuple[int, int], list[int]] = {}
        self.lits: dict[tuple[int, int], list[int]] = {}  # a copy's presence, recompute and swap-in literals
        for u, starts in enumerate(model.s):
            for k in range(len(starts)):
                ints = ([model.s[u][k]] if k else []) + [model.e[u][k], model.size[u][k]]  # copy 0 starts at a constant
                lits = [x for x in (model.pres[u][k] if k else None, model.rc[u][k], model.sw[u][k]) if x is not None]
                self.lits[(u, k)] = [x.Index() for x in lits]
                self.own[(u, k)] = [x.Index() for x in ints] + self.lits[(u, k)]
        self.covers: dict[tuple[int, int], list[int]] = {}
        for (w, c, v, k), y in model.ys.items():
            self.covers.setdefault((w, c), []).append(y.Index())
            self.covers.setdefault((v, k), []).append(y.Index())
        self.per_op = [[x.Index() for x in ([model.out[u]] if model.out[u] is not None else []) + model.zs.get(u, [])]
                       for u in range(len(model.s))]


def _free_vars(model, copies: _Copies, domains: list[tuple[int, ...]], hood: Neighbourhood,
               solution: list[int]) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """The variables a neighbourhood frees (sorted), and the domains it narrows: every variable of a free
    copy, with an absent one allowed to start only in [lo, hi) (left absent if it cannot), each op's swap-out
    and end-residency literals if a copy of it is free, and the cover literals naming a free copy."""
    out: set[int] = set()
    narrowed: dict[int, tuple[int, int]] = {}
    for u, row in enumerate(hood.free):
        any_free = False
        for k, is_free in enumerate(row):
            if not is_free:
                continue
            if _absent(model, solution, u, k):  # an absent copy may only start in [lo, hi)
                start = model.s[u][k].Index()
                window = _start_window(domains[start], hood.lo, hood.hi)
                if window is None:
                    continue
                narrowed[start] = window
            any_free = True
            out.update(copies.own[(u, k)])
            out.update(copies.covers.get((u, k), []))
        if any_free:
            out.update(copies.per_op[u])
    return sorted(out), narrowed


def improve(model, grid, solution: list[int], objective: int, run: LnsRun,
            inputs: list[list[int]] | None = None) -> LnsResult:
    """Window LNS on ``model`` (a mip._CpModel on ``grid``, a mip._Grid: its first-compute positions ``fpos``, the
    first position of each block ``base`` and the ``horizon``) from ``solution`` (objective ``objective``, in ticks)
    as ``run`` says. A sweep that improves nothing doubles the window; each sweep is followed by op neighbourhoods if
    ``inputs`` (each op's input ops) is given. Stops after a sweep over the whole order in which nothing improved,
    at the run's deadline, when its limit is used, or when its stop is requested."""
    fpos, base, horizon = grid.fpos, grid.base, grid.horizon
    time_limit_s, make_solver, deterministic, stop, load_s = (run.time_limit_s, run.make_solver, run.deterministic,
                                                              run.stop, run.load_s)
    n = len(fpos)
    blocks = WINDOW_BLOCKS
    state = {"used": 0.0, "best": list(solution), "obj": objective}
    tried, improved, sweeps, op_sets, op_improved = 0, 0, 0, 0, 0
    call = dl.current() if run.deadline is None else run.deadline

    def out_of_time() -> bool:
        return (time_limit_s - state["used"] < MIN_WINDOW_S or call.left() < load_s + MIN_WINDOW_S
                or (stop is not None and stop.requested))

    def result() -> LnsResult:
        return LnsResult(state["best"], state["obj"], tried, improved, sweeps, op_sets, op_improved, state["used"])

    def attempt(hood: Neighbourhood, seconds: float) -> bool | None:
        """Re-solve one neighbourhood; whether it improved the incumbent (None: nothing free). Sets
        ``state["easy"]``: whether the solver proved its answer optimal in less than EASY_SHARE of its time, and
        ``state["unused"]``: the seconds of its share it did not use."""
        state["easy"] = False
        t0 = time.perf_counter()
        if reducer is None:  # a clone of the whole model
            sub, n_free = _sub_model(model, copies, hood, state["best"])
            back, items = None, 0
        else:
            free_vars, narrowed = _free_vars(model, copies, reducer.domains, hood, state["best"])
            sub, items = reducer.sub_model(state["best"], free_vars, narrowed)
            back = free_vars
            n_free = len(free_vars)
        if not n_free:
            return None
        step = min(seconds, time_limit_s - state["used"])
        solver = make_solver(step)
        if reducer is not None and deterministic:  # one search: an interleaved portfolio sets up each subsolver
            solver.parameters.num_workers, solver.parameters.interleave_search = 1, False  # on a tiny budget
        if stop is not None:
            stop.attach(solver)
        code = solver.Solve(sub)
        if deterministic:
            limit = solver.parameters.max_deterministic_time
            share = min(1.0, solver.ResponseProto().deterministic_time / limit) if limit > 0 else 1.0
            state["used"] += step * share + SECONDS_PER_ITEM * items
        else:
            elapsed = time.perf_counter() - t0
            state["used"] += elapsed
            share = elapsed / step if step > 0 else 1.0
        state["easy"] = code == cp_model.OPTIMAL and share < EASY_SHARE
        state["unused"] = step * (1.0 - min(1.0, share))
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE) and round(solver.ObjectiveValue()) < state["obj"]:
            found = list(solver.ResponseProto().solution)
            if back is not None:  # a sub-model's answer, put back into the incumbent
                found, answer = list(state["best"]), found
                for v, value in zip(back, answer):
                    found[v] = value
            state["best"], state["obj"] = found, round(solver.ObjectiveValue())
            return True
        return False

    def op_round(attempts: int, seconds: float, patience: int = OP_IDLE, budget: float = math.inf) -> bool:
        """Up to ``attempts`` op neighbourhoods, ending after ``patience`` in a row without a gain or once they
        used ``budget`` seconds of the limit; whether any gained."""
        nonlocal op_sets, op_improved
        gained, idle, start = False, 0, state["used"]
        for _ in range(attempts):
            seeds = _rematerialised(model, state["best"])
            if idle >= patience or not seeds or out_of_time() or state["used"] - start >= budget:
                break
            free = _op_free(model, _op_set(model, inputs, state["best"], rng.choice(seeds)))
            gain = attempt(Neighbourhood(free, 0, horizon), seconds)
            op_sets += gain is not None
            op_improved += bool(gain)
            gained, idle = gained or bool(gain), 0 if gain else idle + 1
        return gained

    rng = random.Random(run.seed)
    variables = len(model.m.Proto().variables)
    big = variables > SUBMODEL_ABOVE
    if big and call.left() < READ_SECONDS_PER_VARIABLE * variables + load_s + MIN_WINDOW_S:
        return result()  # reading the model for sub-models, which nothing interrupts, would pass the deadline
    reducer = Reducer(model.m) if big else None
    copies = _Copies(model)
    while True:
        sweeps += 1
        before = state["obj"]
        windows = _windows(n, base, horizon, blocks)
        per_window = max(MIN_WINDOW_S, (time_limit_s - state["used"]) / (2 * len(windows)))
        windows_gained = ops_gained = False
        easy_run, unused = 0, 0.0
        for lo, hi in windows:
            if out_of_time():
                return result()
            gain = attempt(Neighbourhood(_free_copies(model, fpos, state["best"], lo, hi), lo, hi), per_window)
            tried += gain is not None
            improved += bool(gain)
            windows_gained = windows_gained or bool(gain)
            easy = gain is False and state["easy"]
            easy_run, unused = (easy_run + 1, unused + state["unused"]) if easy else (0, 0.0)
            if easy_run >= EASY_RUN and inputs is not None:  # the time those windows did not need
                ops_gained = op_round(2 * OP_IDLE, per_window, EASY_RUN, unused) or ops_gained
                easy_run, unused = 0, 0.0
        ops_gained = (inputs is not None and op_round(max(len(windows), 2 * OP_IDLE), per_window)) or ops_gained
        log.info("lns sweep %d: objective %d -> %d (%d windows, %d op neighbourhoods tried, %.2f s used)", sweeps,
                 before, state["obj"], tried, op_sets, state["used"])
        if out_of_time():
            return result()
        if not windows_gained:
            if blocks >= n and not ops_gained:
                return result()
            blocks *= 2
