"""Independent exact search over event sequences (Dijkstra on states), for the schedule tests.

Written from the semantics in docs/schedule.md only; it shares no code with the solvers. First
computations follow program order, as in every trainplan optimiser.
"""

from __future__ import annotations

import heapq

from trainplan.schedule.problem import Problem


def exact_min_time(problem: Problem, budget: int) -> float | None:
    """Least step time of any valid event list within ``budget`` (None if there is none)."""
    n = problem.n
    b = [op.bytes for op in problem.ops]
    ws = [op.workspace for op in problem.ops]
    t = [op.time for op in problem.ops]
    x = [op.bytes / problem.bandwidth for op in problem.ops]
    need = [sum(1 << w for w in problem.inputs[v]) for v in range(n)]
    keep = sum(1 << k for k in problem.keep_idx)
    cap = budget - problem.fixed_bytes
    if cap < 0:
        return None

    def used(mask: int) -> int:
        return sum(b[u] for u in range(n) if mask >> u & 1)

    start = (0, 0, 0)  # (next first compute, resident mask, host mask)
    dist = {start: 0.0}
    heap = [(0.0, start)]
    while heap:
        d, state = heapq.heappop(heap)
        if d > dist[state]:
            continue
        i, res, host = state
        if i == n and res & keep == keep:
            return d
        mem = used(res)
        moves = []
        if i < n and res & need[i] == need[i] and mem + b[i] + ws[i] <= cap:
            moves.append((t[i], (i + 1, res | 1 << i, host)))
        for u in range(i):
            bit = 1 << u
            if res & bit:
                moves.append((0.0, (i, res & ~bit, host)))
                if problem.ops[u].swap and not host & bit:
                    moves.append((x[u], (i, res, host | bit)))
            else:
                if problem.ops[u].recompute and res & need[u] == need[u] and mem + b[u] + ws[u] <= cap:
                    moves.append((t[u], (i, res | bit, host)))
                if host & bit and mem + b[u] <= cap:
                    moves.append((x[u], (i, res | bit, host)))
        for cost, nxt in moves:
            nd = d + cost
            if nd < dist.get(nxt, float("inf")):
                dist[nxt] = nd
                heapq.heappush(heap, (nd, nxt))
    return None
