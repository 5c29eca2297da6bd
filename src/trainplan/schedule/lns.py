"""Large-neighbourhood search on windows of the program order: CP-SAT re-solves the schedule inside a
window of blocks, every residency period outside it fixed to the incumbent.

The model of :mod:`trainplan.schedule.mip` is built once; each window solves a copy of it in which the
variables of the copies (residency periods) that neither overlap the window nor could start in it are fixed
to the incumbent's values, hinted with the incumbent (so a window never makes it worse). Windows of
``WINDOW_BLOCKS`` first computes slide over the order by half a window; a sweep that improves nothing doubles
the window; sweeps repeat until one over the whole order improves nothing or the time is up. Every window's
answer satisfies the whole model, so it is a valid schedule.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from trainplan.schedule import deadline as dl

log = logging.getLogger(__name__)

WINDOW_BLOCKS = 40  # first computes per window (the sub-model frees about this many ops' periods)
MIN_WINDOW_S = 0.05  # a window starts only with at least this much of the limit left


@dataclass
class LnsResult:
    """The best solution vector (one value per model variable), its objective, and what the search did."""

    solution: list[int]
    objective: int
    windows: int
    improved: int
    sweeps: int
    work_s: float  # seconds of the limit used (deterministic: from each window's deterministic clock)


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


def _set_domain(proto, var, lo: int, hi: int) -> None:
    domain = proto.variables[var.Index()].domain
    domain.clear()
    domain.extend([lo, hi])


def _fix(proto, var, value: int) -> None:
    _set_domain(proto, var, value, value)


def _window_model(base_model: cp_model.CpModel, model, fpos: list[int], solution: list[int], lo: int,
                  hi: int) -> tuple[cp_model.CpModel, int]:
    """A copy of the model with everything outside the window fixed and the incumbent as hint; the count of
    free copies (0: nothing to re-solve)."""
    sub = base_model.Clone()
    proto = sub.Proto()
    free = _free_copies(model, fpos, solution, lo, hi)
    n_free = 0
    for u, row in enumerate(free):
        for k, is_free in enumerate(row):
            ints = ([model.s[u][k]] if k else []) + [model.e[u][k], model.size[u][k]]  # copy 0 starts at a constant
            lits = [x for x in (model.pres[u][k] if k else None, model.rc[u][k], model.sw[u][k]) if x is not None]
            if not is_free:
                for v in ints + lits:
                    _fix(proto, v, solution[v.Index()])
            elif k and solution[model.pres[u][k].Index()] == 0:  # an absent copy may only start in the window
                dom = list(proto.variables[model.s[u][k].Index()].domain)
                start_lo, start_hi = max(lo, dom[0]), min(hi - 1, dom[-1])
                if start_lo > start_hi:
                    for x in lits:
                        _fix(proto, x, 0)
                else:
                    _set_domain(proto, model.s[u][k], start_lo, start_hi)
                    n_free += 1
            else:
                n_free += 1
        if model.out[u] is not None and not any(row):
            _fix(proto, model.out[u], solution[model.out[u].Index()])
    sub.ClearHints()
    hint = proto.solution_hint
    hint.vars.extend(range(len(proto.variables)))
    hint.values.extend(solution)
    return sub, n_free


def improve(model, fpos: list[int], base: list[int], horizon: int, solution: list[int], objective: int,
            time_limit_s: float, make_solver, deterministic: bool) -> LnsResult:
    """Window LNS from ``solution`` (objective ``objective``, in ticks) for ``time_limit_s`` seconds of the
    limit. ``make_solver(seconds)`` returns a configured CP-SAT solver for one window. A sweep that improves
    nothing doubles the window; stops at the call's deadline, when the limit is used, or after such a sweep
    with a window of the whole order."""
    n = len(fpos)
    blocks = WINDOW_BLOCKS
    used, tried, improved, sweeps = 0.0, 0, 0, 0
    best, best_obj = list(solution), objective
    call = dl.current()
    while True:
        sweeps += 1
        before = best_obj
        windows = _windows(n, base, horizon, blocks)
        per_window = max(MIN_WINDOW_S, (time_limit_s - used) / (2 * len(windows)))
        for lo, hi in windows:
            if time_limit_s - used < MIN_WINDOW_S or call.left() < MIN_WINDOW_S:
                return LnsResult(best, best_obj, tried, improved, sweeps, used)
            sub, n_free = _window_model(model.m, model, fpos, best, lo, hi)
            if not n_free:
                continue
            step = min(per_window, time_limit_s - used)
            solver = make_solver(step)
            t0 = time.perf_counter()
            code = solver.Solve(sub)
            tried += 1
            if deterministic:
                limit = solver.parameters.max_deterministic_time
                used += step * min(1.0, solver.ResponseProto().deterministic_time / limit) if limit > 0 else step
            else:
                used += time.perf_counter() - t0
            if code in (cp_model.OPTIMAL, cp_model.FEASIBLE) and round(solver.ObjectiveValue()) < best_obj:
                best, best_obj = list(solver.ResponseProto().solution), round(solver.ObjectiveValue())
                improved += 1
        log.info("lns sweep %d: objective %d -> %d (%d windows tried, %.2f s used)", sweeps, before, best_obj,
                 tried, used)
        if best_obj >= before:  # a sweep that improved nothing (the time running out returns above)
            if blocks >= n:
                return LnsResult(best, best_obj, tried, improved, sweeps, used)
            blocks *= 2
