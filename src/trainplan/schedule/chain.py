"""The linear adjoint chain: the published benchmark of checkpointing (Griewank and Walther's revolve).

A chain of ``length`` steps: states x0 (the input, neither recomputable nor swappable) and
x1..x_{length-1}, each computed from the previous one in one unit of time and holding ``state_bytes``;
then the adjoints a_length..a1, where a_i reads x_{i-1} and a_{i+1} and costs no time or memory. So a
schedule's time is its number of forward steps. revolve's closed form (Griewank 1992; Griewank and
Walther, ACM TOMS 26(1), 2000) gives the fewest forward steps with c state snapshots, advancing the
working state in place. Our semantics are not in place (computing x_{i+1} needs x_i and x_{i+1}
resident), so with a budget of ``slots`` states the optimum lies between revolve with ``slots - 1`` and
``slots - 2`` snapshots; :func:`chain_min_steps` gives it exactly (the revolve recursion, rewritten for
our memory model). ``chain_dp.chain_dp_events`` builds schedules that attain it, for this and any
heterogeneous adjoint chain.
"""

from __future__ import annotations

import math
import random
from functools import lru_cache

from trainplan.schedule.problem import Op, Problem

INF = math.inf


def adjoint_chain(length: int, state_bytes: int = 1000, *, slots: int | None = None) -> Problem:
    """The chain of ``length`` steps as a problem; budget ``slots`` states (default: no limit)."""
    if length < 1:
        raise ValueError(f"chain length must be >= 1, got {length}")
    ops = [Op("x0", 0.0, state_bytes, (), recompute=False, swap=False)]
    ops += [Op(f"x{i}", 1.0, state_bytes, (f"x{i - 1}",), swap=False) for i in range(1, length)]
    for i in range(length, 0, -1):
        ins = (f"x{i - 1}",) + ((f"a{i + 1}",) if i < length else ())
        ops.append(Op(f"a{i}", 0.0, 0, ins, recompute=False, swap=False))
    budget = 10**18 if slots is None else slots * state_bytes
    return Problem(tuple(ops), budget_bytes=budget, bandwidth=1e9, keep=("a1",))


def heterogeneous_chain(length: int, seed: int, *, unit: int = 100, budget_bytes: int = 10**18) -> Problem:
    """An adjoint chain of ``length`` steps with random costs (Rotor's heterogeneous chains): state i takes
    0.1-2 s and 1-5 ``unit`` bytes with a workspace of 0, 1 or 3 units; adjoint i takes 0.1-2 s and 0-3
    units with a workspace of 0 or 1; x0 (0-1 s) is neither recomputable nor swappable, nor is any
    adjoint; states are not swappable (the DP does not swap)."""
    if length < 1:
        raise ValueError(f"chain length must be >= 1, got {length}")
    rng = random.Random(seed)
    ops = [Op("x0", rng.uniform(0, 1), rng.randint(1, 5) * unit, (), recompute=False, swap=False)]
    for i in range(1, length):
        ops.append(Op(f"x{i}", rng.uniform(0.1, 2), rng.randint(1, 5) * unit, (f"x{i - 1}",),
                      workspace=rng.choice([0, 0, 1, 3]) * unit, swap=False))
    for i in range(length, 0, -1):
        ins = (f"x{i - 1}",) + ((f"a{i + 1}",) if i < length else ())
        ops.append(Op(f"a{i}", rng.uniform(0.1, 2), rng.randint(0, 3) * unit, ins,
                      workspace=rng.choice([0, 1]) * unit, recompute=False, swap=False))
    return Problem(tuple(ops), budget_bytes=budget_bytes, bandwidth=1e9, keep=("a1",))


def revolve_min_steps(length: int, snapshots: int) -> int:
    """revolve's optimum: r * l - C(c + r, c + 1), r the least with C(c + r, c) >= l (c >= 1)."""
    if snapshots < 1:
        raise ValueError("revolve needs at least one snapshot")
    r = 0
    while math.comb(snapshots + r, snapshots) < length:
        r += 1
    return r * length - math.comb(snapshots + r, snapshots + 1)


@lru_cache(maxsize=8)
def _table(length: int, slots: int) -> list[list[float]]:
    """cost[m][n]: fewest forward steps to reverse n steps from a resident start state with m states of
    memory (the start included)."""
    cost = [[INF] * (length + 1) for _ in range(slots + 1)]
    for m in range(1, slots + 1):
        cost[m][1] = 0.0
        for n in range(2, length + 1):
            for j in range(1, n):
                if m < (2 if j == 1 else 3):  # advancing twice needs the start, the input and the output
                    break
                cost[m][n] = min(cost[m][n], j + cost[m - 1][n - j] + cost[m][j])
    return cost


def chain_min_steps(length: int, slots: int) -> float:
    """Fewest forward steps of any valid schedule of :func:`adjoint_chain` within ``slots`` states
    (inf if none): advance j steps freeing as you go, keep x_j, reverse the rest with one slot less,
    free x_j, reverse the first j steps; minimised over j."""
    return _table(length, slots)[slots][length]
