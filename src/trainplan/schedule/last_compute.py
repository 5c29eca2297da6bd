"""Last-compute search: an exact search for a recompute-only schedule within a budget, backwards from the keep set.

Frees cost nothing, so if a set of tensors can be resident together, so can any subset of it. Hence a set R is
reachable (some event list ends with at least R resident) iff R is empty or, for some v in R (the one computed
last), the set (R - {v}) | inputs(v) is reachable and fits the budget with v's output and workspace. Searching
these sets from the keep set down to the empty set decides whether any recompute-only schedule fits the budget,
in any order of first computes (the black pebble game with sizes: PSPACE-complete in general, Gilbert, Lengauer
and Tarjan 1980, so the search has a work cap). Two reductions keep it small without losing a schedule:

* a v in R whose inputs all lie in R is always the one to take (R and R - {v} are reachable together);
* a set containing a set already seen is not searched (whatever empties it empties the smaller one).

The path found, read forwards, is an event list: each step computes v from (R - {v}) | inputs(v) and frees what
R does not hold. An exhausted search proves that no recompute-only schedule fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.schedule import deadline as dl
from trainplan.schedule.heuristic import Events
from trainplan.schedule.problem import Problem


@dataclass(frozen=True)
class SearchResult:
    """``found`` (``events`` fit the budget), ``infeasible`` (no recompute-only schedule fits: the search ended) or
    ``unknown`` (stopped at its work cap or deadline, or not applicable: ``reason``); ``states``: the sets seen;
    ``work``: the members of every set made (what its time grows with)."""

    status: str
    events: Events | None
    states: int
    work: int = 0
    reason: str = ""


def not_applicable(problem: Problem) -> str | None:
    """Why the search does not apply to ``problem`` (an op that cannot be recomputed, a further output, no keep
    set, or an op no keep op needs: the search makes only what the keep set needs), else None."""
    p = problem
    if not p.keep_idx:
        return "no keep set"
    for op in p.ops:
        if not op.recompute:
            return f"op '{op.id}' cannot be recomputed"
        if op.of is not None:
            return f"op '{op.id}' is a further output"
    needed = set(p.keep_idx)
    for v in range(p.n - 1, -1, -1):
        if v in needed:
            needed.update(p.inputs[v])
    if len(needed) < p.n:
        missing = next(op.id for v, op in enumerate(p.ops) if v not in needed)
        return f"op '{missing}' is needed by no keep op"
    return None


def search(problem: Problem, budget: int, *, max_work: int, stop: dl.Deadline = dl.NEVER) -> SearchResult:
    """Depth first from the keep set (the latest op in a set taken first), within ``max_work`` (set members made,
    see SearchResult) and ``stop``. ``infeasible`` holds over every recompute-only schedule (swaps not used);
    deterministic for a work cap."""
    why = not_applicable(problem)
    if why is not None:
        return SearchResult("unknown", None, 0, 0, why)
    p, cap = problem, budget - problem.fixed_bytes
    size = [op.bytes for op in p.ops]
    extra = [op.workspace for op in p.ops]
    needs = [sum(1 << u for u in ins) for ins in p.inputs]

    def mem(mask: int) -> int:
        total = 0
        while mask:
            low = mask & -mask
            total += size[low.bit_length() - 1]
            mask ^= low
        return total

    def close(mask: int, used: int) -> tuple[int, int, tuple[int, ...]]:
        """Take every op whose inputs the set holds, until none is left; the set, its bytes, the ops taken."""
        taken: list[int] = []
        changed = True
        while changed:
            changed = False
            rest = mask
            while rest:
                low = rest & -rest
                rest ^= low
                v = low.bit_length() - 1
                if needs[v] & ~mask == 0 and used + extra[v] <= cap:
                    mask ^= low
                    used -= size[v]
                    taken.append(v)
                    changed = True
        return mask, used, tuple(taken)

    keep = sum(1 << u for u in p.keep_idx)
    kept = mem(keep)
    if kept > cap:
        return SearchResult("infeasible", None, 1, 1)
    goal, used, taken = close(keep, kept)
    parent: dict[int, tuple[int, int, tuple[int, ...]] | None] = {goal: None}  # set -> (set before, v, taken)
    stack = [(goal, used)]
    work = 0
    while stack:
        here, used = stack.pop()
        if here == 0:
            return SearchResult("found", _events(p, parent, keep, taken), len(parent), work)
        if work > max_work or stop.passed():
            return SearchResult("unknown", None, len(parent), work,
                                "deadline" if work <= max_work else f"work cap {max_work}")
        children = []
        rest = here
        while rest:
            low = rest & -rest
            rest ^= low
            v = low.bit_length() - 1
            added = needs[v] & ~here
            before = used - size[v] + mem(added)
            if before + size[v] + extra[v] > cap:
                continue
            nxt, nxt_used, nxt_taken = close((here ^ low) | added, before)
            work += nxt.bit_count() + 1
            if nxt in parent or _holds_a_seen_set(nxt, parent):
                continue
            parent[nxt] = (here, v, nxt_taken)
            children.append((nxt, nxt_used))
        stack.extend(children)  # popped last first: the latest op's child is searched first
    return SearchResult("infeasible", None, len(parent), work)


def _holds_a_seen_set(mask: int, seen: dict[int, object]) -> bool:
    """Whether ``mask`` less one of its members was seen (the cheap part of the superset test)."""
    rest = mask
    while rest:
        low = rest & -rest
        rest ^= low
        if mask ^ low in seen:
            return True
    return False


def _events(problem: Problem, parent: dict[int, tuple[int, int, tuple[int, ...]] | None], keep: int,
            goal_taken: tuple[int, ...]) -> Events:
    """The forward event list of the path from the empty set back to the keep set."""
    ids = [op.id for op in problem.ops]
    steps = []  # (set before computing v, v, ops taken after it) from the empty set up
    here = 0
    while parent[here] is not None:
        up, v, taken = parent[here]
        steps.append((v, taken, up))
        here = up
    events: Events = []
    resident = 0
    for v, taken, up in steps:
        for u in reversed(taken):  # the ops the step's set took, made again in reverse
            events.append(("compute", ids[u]))
            resident |= 1 << u
        events.append(("compute", ids[v]))
        resident |= 1 << v
        events += [("free", ids[u]) for u in _members(resident & ~up)]
        resident = up
    for u in reversed(goal_taken):
        events.append(("compute", ids[u]))
        resident |= 1 << u
    events += [("free", ids[u]) for u in _members(resident & ~keep)]
    return events


def _members(mask: int) -> list[int]:
    """The op indices in ``mask``, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out
