"""Last-compute search: it decides recompute-only budgets as an independent forward search over resident sets does,
its schedules replay within the budget, and through solve it meets budgets no fast schedule meets or proves them
infeasible."""

from dataclasses import replace

import pytest

from trainplan.schedule import deadline as dl
from trainplan.schedule import fast
from trainplan.schedule.context import Context
from trainplan.schedule.last_compute import not_applicable, search
from trainplan.schedule.problem import Op, Problem, ProblemError
from trainplan.schedule.replay import replay
from trainplan.schedule.settings import DEFAULTS
from trainplan.schedule.solve import solve
from trainplan.schedule.synthetic import layered_graph

from test_schedule_deadline import independent_replay


def _forward_feasible(problem: Problem, budget: int) -> bool:
    """Whether some recompute-only event list keeps the keep set resident at the end within ``budget``, first
    computes in any order: depth first over every resident set reachable by one compute or one free (written
    from the replay semantics only; every op here is an ancestor of the keep set, so making it makes them all)."""
    p = problem
    size = [op.bytes for op in p.ops]
    needs = [sum(1 << u for u in ins) for ins in p.inputs]
    keep = sum(1 << u for u in p.keep_idx)
    cap = budget - p.fixed_bytes
    seen, stack = {0}, [(0, 0)]
    while stack:
        here, used = stack.pop()
        if here & keep == keep:
            return True
        moves = [(here | 1 << v, used + size[v]) for v in range(p.n)
                 if not here >> v & 1 and needs[v] & ~here == 0 and used + size[v] + p.ops[v].workspace <= cap]
        moves += [(here & ~(1 << u), used - size[u]) for u in range(p.n) if here >> u & 1]
        for nxt in moves:
            if nxt[0] not in seen:
                seen.add(nxt[0])
                stack.append(nxt)
    return False


@pytest.mark.parametrize("n", [8, 11, 14])
def test_the_search_decides_every_budget_as_a_forward_search_does(n):
    checked = {"found": 0, "infeasible": 0}
    for seed in range(8):
        p = layered_graph(n, 100 + seed)
        for frac in (0.95, 1.0, 1.03, 1.08, 1.2, 1.5):
            budget = int(frac * p.floor_bytes)
            got = search(p, budget, max_work=10**8)
            assert got.status == ("found" if _forward_feasible(p, budget) else "infeasible"), (seed, frac)
            checked[got.status] += 1
            if got.events is not None:
                _, peak = independent_replay(p, got.events)  # every op computed, the keep set resident at the end
                assert peak <= budget and replay(p, got.events, budget).peak_bytes == peak
    assert checked["found"] and checked["infeasible"]  # both answers were put to the test


def test_the_search_stops_at_its_state_cap_and_deadline():
    p = layered_graph(250, 0)
    budget = int(1.1 * p.floor_bytes)
    assert search(p, budget, max_work=10**8).status == "found"
    capped = search(p, budget, max_work=1000)
    assert capped.status == "unknown" and capped.events is None and "cap" in capped.reason
    late = search(p, budget, max_work=10**8, stop=dl.Deadline(0.0))
    assert late.status == "unknown" and late.reason == "deadline"


@pytest.mark.parametrize("change, why", [
    (lambda ops: [replace(ops[0], recompute=False), *ops[1:]], "cannot be recomputed"),
    (lambda ops: [*ops, Op("dead", 1.0, 5, ("a",))], "needed by no keep op"),
])
def test_the_search_says_where_it_does_not_apply(change, why):
    ops = [Op("a", 1.0, 10), Op("b", 1.0, 10, ("a",)), Op("c", 1.0, 10, ("a", "b"))]
    p = Problem(tuple(change(ops)), 100, 1.0, keep=("c",))
    got = search(p, 100, max_work=10)
    assert got.status == "unknown" and why in got.reason and why in not_applicable(p)
    assert "no keep set" in not_applicable(Problem(tuple(ops), 100, 1.0))


def test_a_new_op_order_must_be_topological_and_complete():
    p = Problem((Op("a", 1.0, 10), Op("b", 1.0, 10, ("a",))), 100, 1.0, keep=("b",))
    assert [op.id for op in p.in_order(["a", "b"]).ops] == ["a", "b"]
    with pytest.raises(ProblemError, match="'b' would come before its input 'a'"):
        p.in_order(["b", "a"])
    with pytest.raises(ProblemError, match="every op once"):
        p.in_order(["a"])


@pytest.mark.parametrize("n, seed, frac", [(24, 6, 1.0), (100, 0, 1.1)])
def test_solve_meets_a_budget_only_the_search_meets(n, seed, frac):
    """The fast schedules find none; the search's schedule, in its own order of first computes, is the one the
    rest of the run improves, and the answer replays within the requested budget."""
    p = layered_graph(n, seed)
    budget = int(frac * p.floor_bytes)
    got = solve(p.with_budget(budget), time_limit_s=3, workers=1)
    assert got.ok and got.extra["budget_status"] == "met" and got.budget_bytes == budget
    assert got.extra["heuristic"] == "last-compute-search"
    assert got.extra["program_order"] == "the first computes of the last-compute-search schedule"
    time_s, peak = independent_replay(p, got.events)
    assert peak <= budget and time_s == pytest.approx(got.time, rel=1e-12)


def test_solve_proves_a_recompute_only_budget_infeasible_by_the_search():
    """Above the single-op floor, so only the search's proof says so; the forward search agrees, and the raised
    budget's schedule is valid."""
    p = layered_graph(12, 0)
    budget = int(1.05 * p.floor_bytes)
    assert budget >= p.floor_bytes and not _forward_feasible(p, budget)
    got = solve(p.with_budget(budget), time_limit_s=2, workers=1)
    assert got.extra["budget_status"] == "proven_infeasible"
    assert got.extra["infeasibility_proof"].startswith("last-compute search")
    assert got.budget_bytes > budget and got.extra["requested_budget_bytes"] == budget
    assert _forward_feasible(p, got.budget_bytes)
    assert independent_replay(p, got.events)[1] <= got.budget_bytes


def test_no_proof_where_an_op_could_be_swapped():
    """The search uses no swap, so its 'none fits' proves nothing where one op can be swapped."""
    p = layered_graph(12, 0)
    ops = (replace(p.ops[0], swap=True), *p.ops[1:])
    q = Problem(ops, p.budget_bytes, p.bandwidth, keep=p.keep)
    got = solve(q.with_budget(int(1.05 * q.floor_bytes)), time_limit_s=2, workers=1)
    assert "last-compute" not in (got.extra.get("infeasibility_proof") or "")


def test_a_probe_search_is_charged_its_work_and_takes_a_share_of_the_allowance():
    """In a bisection's probe the search may use probe_search_share of the allowance left, charged by its work (the
    same on every run): on a graph it cannot decide, it stops there and the probe goes on; where it finds a
    schedule, the probe returns it."""
    p = layered_graph(300, 0)  # undecided in 1e8 units at 1.1x the floor
    p = p.with_budget(int(1.1 * p.floor_bytes))
    allowance = dl.Allowance(2.0)
    units = DEFAULTS.probe_search_share * allowance.units(DEFAULTS.search_work_per_second)
    ctx = Context.detached(p, allowance=allowance)
    fast.last_compute(ctx)
    assert ctx.incumbent.events is None and ctx.proof is None
    spent = 2.0 - allowance.seconds
    assert units / DEFAULTS.search_work_per_second <= spent <= 1.05 * units / DEFAULTS.search_work_per_second
    again = dl.Allowance(2.0)
    fast.last_compute(Context.detached(p, allowance=again))
    assert again.seconds == allowance.seconds
    q = layered_graph(100, 0)
    ctx = Context.detached(q.with_budget(int(1.1 * q.floor_bytes)), allowance=dl.Allowance(60.0))
    fast.last_compute(ctx)
    assert ctx.incumbent.events is not None and ctx.incumbent.time is not None and ctx.proof is None
