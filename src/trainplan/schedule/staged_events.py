"""A schedule from a solution of the staged model (``staged_bound.solve_staged``)."""

from __future__ import annotations

from trainplan.schedule.heuristic import Events
from trainplan.schedule.problem import Problem
from trainplan.schedule.replay import take_outputs_at_once
from trainplan.schedule.staged_bound import StagedSolution


def _restore_order(p: Problem, sol: StagedSolution, i: int) -> list[int]:
    """The restores of stage i, each recompute after the restores of its inputs: first the tensors still
    resident at i (in program order), each with what it needs, then the rest."""
    restored = sol.recomputed[i] | sol.swapped_in[i]
    order: list[int] = []

    def visit(u: int) -> None:
        if u in order:
            return
        if u not in sol.swapped_in[i]:
            for w in p.inputs[u]:
                if w in restored:
                    visit(w)
        order.append(u)

    for u in sorted(restored, key=lambda u: (u not in sol.resident[i], u)):
        visit(u)
    return order + sorted(sol.restored_twice[i])


def staged_events(problem: Problem, sol: StagedSolution) -> Events:
    """Events that realise ``sol``: at each instant i, the stage's restores in :func:`_restore_order`
    (a swap-in where the solution has both; a second restore is a swap-in if the tensor has a host copy),
    each tensor freed as soon as no later restore of the stage
    reads it and it is not resident at i (a tensor restored in the stage is freed first, after its last
    use by an earlier restore), then op i's first compute and its swap-out if the solution swaps it in
    later. The staged model counts memory inside a stage only in part, so the events may exceed the
    budget: replay them."""
    p = problem
    events: Events = []
    resident: set[int] = set()
    for i in range(p.n + 1):
        order = _restore_order(p, sol, i)
        pos = {u: k for k, u in enumerate(order)}  # a tensor restored twice: its second restore
        at_i = sol.resident[i] | (set(p.inputs[i]) if i < p.n else set())

        def needed(v: int, k: int) -> bool:
            """Whether v must stay resident after the first k restores of the stage."""
            again = v in pos and pos[v] >= k  # restored later in the stage: free it before that
            readers = order[k:pos[v]] if again else order[k:]
            reads = any(u not in sol.swapped_in[i] and v in p.inputs[u] for u in readers)
            return reads or (not again and v in at_i)

        def free(k: int) -> None:
            for v in sorted(resident):
                if not needed(v, k):
                    events.append(("free", p.ops[v].id))
                    resident.discard(v)

        free(0)
        for k, u in enumerate(order):
            swap = u in sol.swapped_in[i] or (k == pos[u] and u in sol.restored_twice[i] and u in sol.swapped_out)
            events.append(("swap_in" if swap else "compute", p.ops[u].id))
            resident.add(u)
            free(k + 1)
        if i < p.n:
            events.append(("compute", p.ops[i].id))
            resident.add(i)
            if i in sol.swapped_out:
                events.append(("swap_out", p.ops[i].id))
    return take_outputs_at_once(p, events)
