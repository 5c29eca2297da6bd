"""Checkpointing dynamic programme for adjoint chains with heterogeneous costs (revolve / Rotor style).

An *adjoint chain* of length L is a problem whose ops are, in program order, the states x_0..x_{L-1}
(x_0 reads nothing, x_i reads x_{i-1} and is recomputable for i >= 1) followed by the adjoints
a_L..a_1, where a_i reads x_{i-1} and a_{i+1} (a_L reads only x_{L-1}); ``keep`` may name a_1 and x_0.
Times, bytes and workspaces are arbitrary. This is the shape of the published checkpointing benchmark
(Griewank and Walther's revolve) and of Rotor's heterogeneous chains (Beaumont et al. 2019).

R(s, t, M): with x_s and a_{t+1} resident and M units of memory for the subproblem (both included),
compute a_t..a_{s+1}, ending with a_{s+1} and x_s resident. Either t = s + 1 (compute a_{s+1}, free
a_{s+2}), or advance from x_s to x_j (freeing x_{s+1}..x_{j-1} on the way), solve R(j, t, M - |x_s|),
free x_j and solve R(s, j, M). Memory is counted in units: the gcd of the sizes when that is exact
within ``max_units``, else a coarser unit with demands rounded up, so every schedule fits the budget.
With equal state sizes the DP is the exact optimum of our memory model (the tests check it against
an independent search); with unequal ones it is a heuristic that may miss schedules outside this
recursion (and it never swaps). Vectorised over start state, memory and split with numpy:
O(L^3 M / 6) element operations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import reduce

import numpy as np

from trainplan.schedule.heuristic import Events
from trainplan.schedule.problem import Op, Problem
from trainplan.schedule.replay import take_outputs_at_once

MAX_WORK = 3e8  # element operations the DP may spend (about 1-3 s of numpy on this host)
MAX_TABLE = 1e7  # entries of the cost table (80 MB as float64)


def chain_length(problem: Problem) -> int | None:
    """L if ``problem`` is an adjoint chain of length L (see the module docstring), else None."""
    n = problem.n
    if n < 2 or n % 2:
        return None
    length = n // 2
    ins = problem.inputs
    if ins[0] or any(ins[i] != (i - 1,) or not problem.ops[i].recompute for i in range(1, length)):
        return None
    for i in range(1, length + 1):
        want = {i - 1} | ({2 * length - i - 1} if i < length else set())
        if ins[2 * length - i] != tuple(sorted(want)):
            return None
    return length if problem.keep_idx <= {0, n - 1} else None


def _unit(sizes: list[int], cap: int, max_units: int) -> int:
    """Bytes per memory unit: the gcd of the sizes if the cap is at most ``max_units`` of it."""
    g = reduce(math.gcd, (s for s in sizes if s), 0)
    if g and cap // g <= max_units:
        return g
    return max(1, -(-cap // max_units))


def chain_dp_events(problem: Problem, budget_bytes: int, *, max_work: float = MAX_WORK,
                    least_memory: bool = False) -> Events | None:
    """The DP's schedule of an adjoint chain within ``budget_bytes``; None if ``problem`` is not an
    adjoint chain, the DP finds no schedule, or the table would exceed ``max_work`` / ``MAX_TABLE``.
    ``least_memory``: instead the fastest schedule at the least memory in the DP's table (the table
    holds every memory up to the budget, so one run answers a whole bisection probe)."""
    length = chain_length(problem)
    cap = budget_bytes - problem.fixed_bytes
    if length is None or cap < 0:
        return None
    L = length
    ops = problem.ops
    xs = ops[:L]
    adj = [ops[2 * L - i] for i in range(1, L + 1)]  # adj[i - 1] is a_i
    sizes = [op.bytes for op in ops] + [op.workspace for op in ops]
    max_units = int(min(max_work / max(1.0, L**3 / 6), MAX_TABLE / (L + 1) ** 2)) - 1
    if max_units < 1:
        return None
    unit = _unit(sizes, cap, max_units)
    mu = cap // unit

    def units(v: int) -> int:
        return -(-v // unit)

    X = np.array([units(op.bytes) for op in xs], dtype=np.int64)
    W = np.array([units(op.workspace) for op in xs], dtype=np.int64)
    A = np.zeros(L + 2, dtype=np.int64)  # A[i]: a_i's units, A[L + 1] = 0 (no a_{L+1})
    V = np.zeros(L + 2, dtype=np.int64)
    A[1:L + 1] = [units(op.bytes) for op in adj]
    V[1:L + 1] = [units(op.workspace) for op in adj]
    if X[0] + W[0] > mu:
        return None
    prefix = np.concatenate(([0.0], np.cumsum([op.time for op in xs])))
    M = np.arange(mu + 1)
    # pair[k, s]: the largest working set while advancing k steps from x_s (x_s itself not included)
    pair = np.full((L, L), np.iinfo(np.int64).max // 4, dtype=np.int64)
    step = np.concatenate(([0], X[:-1] + X[1:] + W[1:]))  # step[i]: x_{i-1}, x_i and x_i's workspace
    if L > 1:
        pair[1, :L - 1] = X[1:] + W[1:]  # the first step's input is x_s itself
    for k in range(2, L):
        pair[k, :L - k] = np.maximum(pair[k - 1, :L - k], step[k:])
    cost = np.full((L + 1, mu + 1, L), np.inf)
    split = np.zeros((L + 1, mu + 1, L), dtype=np.int32)
    s = np.arange(L)
    base = X[s] + A[s + 2] + A[s + 1] + V[s + 1]
    cost[1][M[:, None] >= base[None, :]] = 0.0
    for n in range(2, L + 1):
        S = L - n + 1
        s = np.arange(S)
        ks = np.arange(1, n)
        rows = M[:, None] - X[None, :S]  # memory left for R(j, t) once x_s is held
        right = cost[(n - ks)[:, None, None], np.maximum(rows, 0)[None], s[None, None, :] + ks[:, None, None]]
        right = np.where(rows[None] >= 0, right, np.inf)
        held = (X[:S] + A[s + n + 1])[None, :] + pair[1:n, :S]  # (k, s)
        fits = M[None, :, None] >= held[:, None, :]
        tsum = prefix[s[None, :] + ks[:, None] + 1] - prefix[s + 1][None, :]
        cand = np.where(fits, tsum[:, None, :] + right + cost[1:n, :, :S], np.inf)
        best = np.argmin(cand, axis=0)
        cost[n, :, :S] = np.take_along_axis(cand, best[None], axis=0)[0]
        split[n, :, :S] = best + 1
    first = int(X[0] + W[0])  # computing x_0 needs its output and workspace
    finite = first + np.flatnonzero(np.isfinite(cost[L, first:, 0]))
    if not finite.size:
        return None
    return take_outputs_at_once(problem, _events(xs, adj, X, split, int(finite[0]) if least_memory else mu))


def _events(xs: Sequence[Op], adj: Sequence[Op], X: np.ndarray, split: np.ndarray, mu: int) -> Events:
    """Unfold the DP's split table into events (an explicit stack: no deep recursion)."""
    L = len(xs)
    events: Events = [("compute", xs[0].id)]
    todo: list[tuple[int, int, int] | str] = [(0, L, mu)]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            events.append(("free", item))
            continue
        s, n, m = item
        if n == 1:
            events.append(("compute", adj[s].id))  # a_{s+1}
            if s + 2 <= L:
                events.append(("free", adj[s + 1].id))  # a_{s+2}
            continue
        k = int(split[n, m, s])
        j = s + k
        for i in range(s + 1, j + 1):
            events.append(("compute", xs[i].id))
            if i - 1 > s:
                events.append(("free", xs[i - 1].id))
        todo += [(s, k, m), xs[j].id, (j, n - k, m - int(X[s]))]
    return events
