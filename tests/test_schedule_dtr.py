"""The DTR-style eviction plan: valid under the budget on wide layered DAGs, and cheaper than the greedy."""

import pytest

from trainplan.schedule.baselines import no_recompute_events
from trainplan.schedule import problem_from_dict
from trainplan.schedule.dtr import DtrOptions, chain_peak, dtr_plan, plain_memory
from trainplan.schedule.heuristic import POLICIES, greedy
from trainplan.schedule.replay import replay
from trainplan.schedule.synthetic import layered_graph


def test_plain_memory_matches_the_no_recompute_replay():
    p = layered_graph(300, 4)
    mem, _ = plain_memory(p)
    assert max(mem) == replay(p, no_recompute_events(p)).peak_bytes


@pytest.mark.parametrize("seed, swap, frac", [(0, False, 0.9), (0, False, 0.8), (3, True, 0.8), (5, True, 0.7)])
def test_plan_fits_and_beats_the_greedy(seed, swap, frac):
    p = layered_graph(250, seed, swap=swap)
    budget = int(frac * replay(p, no_recompute_events(p)).peak_bytes)
    events = dtr_plan(p, budget, DtrOptions(allow_swap=swap, restarts=2))
    assert events is not None
    rep = replay(p, events, budget)  # raises if invalid or over the budget
    assert rep.peak_bytes <= budget and rep.time >= p.compute_time
    if not swap:
        assert rep.swap_ins == 0
    others = [greedy(p, budget, allow_swap=swap, policy=policy) for policy in POLICIES]
    times = [replay(p, e).time for e in others if e is not None]
    assert all(rep.time <= t for t in times), (rep.time, times)


def test_restarts_are_reproducible():
    p = layered_graph(200, 2)
    budget = int(0.8 * replay(p, no_recompute_events(p)).peak_bytes)
    assert dtr_plan(p, budget, DtrOptions(restarts=3, seed=7)) == dtr_plan(p, budget, DtrOptions(restarts=3, seed=7))


def test_a_recompute_chain_frees_each_ancestor_after_its_last_reader():
    """x -> a -> b -> u and x -> u: recomputing u holds x until u, a only until b; the peak beyond u's own
    bytes is the largest such moment (the restored tensor itself is counted as live by the plan)."""
    p = problem_from_dict({"ops": [{"id": "x", "time": 1, "bytes": 100, "inputs": []},
                                   {"id": "a", "time": 1, "bytes": 10, "inputs": ["x"]},
                                   {"id": "b", "time": 1, "bytes": 20, "inputs": ["a"], "workspace": 5},
                                   {"id": "u", "time": 1, "bytes": 1000, "inputs": ["b", "x"]}],
                           "budget_bytes": 10**6, "bandwidth": 1.0, "keep": ["u"]})
    # x 100; a 100+10; b 100+10+20+5 (a freed after b); u: 100+20 held while u runs
    assert chain_peak(p, [0, 1, 2, 3]) == 135


def test_a_large_recompute_only_graph_at_80_percent_gets_a_plan():
    """The 1000-op layered DAG, seed 1, at 80%: holding every recomputed ancestor until the step found no
    plan; freeing each after its last reader leaves room for one."""
    p = layered_graph(1000, 1)
    budget = int(0.8 * replay(p, no_recompute_events(p)).peak_bytes)
    events = dtr_plan(p, budget, DtrOptions(allow_swap=False))
    assert events is not None and replay(p, events, budget).peak_bytes <= budget


def test_short_chains_failing_the_plan_is_made_with_chains_of_any_length(monkeypatch):
    """The 250-op layered DAG, seed 1, at 80%: no plan restores every gap with at most 8 recomputes (early or
    late restores); with chains of any length one does (holding inputs, restoring late first), and it fits."""
    import trainplan.schedule.dtr as dtr
    p = layered_graph(250, 1)
    budget = int(0.8 * replay(p, no_recompute_events(p)).peak_bytes)
    unbounded = dtr._plan(p, budget, dtr._Rules(False, p.n, early=False, hold=True), dtr.Effort(dtr.dl.NEVER)).events()
    monkeypatch.setattr(dtr, "MAX_CHAIN", 8)
    assert _kind_best(p, budget, 8) is None
    early = dtr._plan(p, budget, dtr._Rules(False, p.n, early=True), dtr.Effort(dtr.dl.NEVER))
    assert max(len(c) for c in early.chains.values()) > 8
    events = dtr_plan(p, budget, DtrOptions(allow_swap=False))
    assert events is not None and events == unbounded
    assert replay(p, events, budget).peak_bytes <= budget


def test_the_plans_with_chains_of_any_length_get_the_restarts(monkeypatch):
    """Where short chains fail (250-op seed 1 at 80%, at most 6 recomputes, holding inputs or not), the bounded
    plans stop after the two unperturbed ones of each kind fail, and the unbounded plans that hold inputs are made
    in the attempts the bounded ones would get (1 + restarts // 2), restoring late first and, as the first fits,
    only late (perturbed after the first); they find a plan, so the other kind is not made, and the cheapest is
    kept: never dearer than one plan. ``found`` is when the first valid plan was ready, before the restarts."""
    import time

    import trainplan.schedule.dtr as dtr
    p = layered_graph(250, 1)
    budget = int(0.8 * replay(p, no_recompute_events(p)).peak_bytes)
    monkeypatch.setattr(dtr, "MAX_CHAIN", 6)
    made: list[tuple[int, bool, bool]] = []  # (max_chain, hold, early) of each plan made
    ready: list[float] = []  # when each plan that fits was made
    real_plan = dtr._plan

    def counting_plan(problem, budget_bytes, rules, effort, rng):
        made.append((rules.max_chain, rules.hold, rules.early))
        plan = real_plan(problem, budget_bytes, rules, effort, rng)
        if plan is not None:
            ready.append(time.perf_counter())
        return plan

    monkeypatch.setattr(dtr, "_plan", counting_plan)
    one = replay(p, dtr_plan(p, budget, DtrOptions(allow_swap=False)), budget).time
    made.clear()
    ready.clear()
    found: list[float] = []
    several = replay(p, dtr_plan(p, budget, DtrOptions(allow_swap=False, restarts=6), found=found), budget).time
    # the bounded late plans failed, the unbounded late one holding inputs fitted, the bounded early ones failed,
    # and the restarts went to the unbounded plans holding inputs: late only
    assert made == [(6, False, False), (6, True, False), (p.n, True, False), (6, False, True), (6, True, True),
                    (p.n, True, False)]
    assert several <= one and len(found) == 1
    assert len(ready) > 1 and ready[0] <= found[0] < ready[1]


def test_where_the_late_fallback_plan_does_not_fit_the_early_one_is_made(monkeypatch):
    """The same case with every late plan of unbounded chains made to fail: the fallback then makes the early plan,
    and its restarts alternate again (late, then early)."""
    import trainplan.schedule.dtr as dtr
    p = layered_graph(250, 1)
    budget = int(0.8 * replay(p, no_recompute_events(p)).peak_bytes)
    monkeypatch.setattr(dtr, "MAX_CHAIN", 6)
    made: list[tuple[int, bool, bool]] = []
    real_plan = dtr._plan

    def no_late_fallback(problem, budget_bytes, rules, effort, rng):
        made.append((rules.max_chain, rules.hold, rules.early))
        if rules.max_chain == problem.n and not rules.early:
            return None
        return real_plan(problem, budget_bytes, rules, effort, rng)

    monkeypatch.setattr(dtr, "_plan", no_late_fallback)
    events = dtr_plan(p, budget, DtrOptions(allow_swap=False, restarts=6))
    assert events is not None and replay(p, events, budget).peak_bytes <= budget
    assert made[2] == (p.n, True, False)  # before the bounded early plans
    assert made[5:] == [(p.n, True, True), (p.n, True, False), (p.n, True, True)]  # 1 + 6 // 2 attempts in all


def test_refinement_gets_its_work_however_long_the_plan_took(monkeypatch):
    """The refinement's wall-clock safety net counts from its own start: where the plan took longer to make than
    the refinement's share of the heuristics' time (a big graph, a slow machine), the refinement still does its
    whole work, and refines the plan as it does when the plan comes at once."""
    import time

    import trainplan.schedule.dtr as dtr
    from trainplan.schedule.context import FastOptions
    from trainplan.schedule.portfolio import best_heuristic
    from trainplan.schedule.settings import DEFAULTS

    p, budget = _layered(300, 2)
    deadline_s = 2.0
    refined: list[tuple[float, float]] = []
    real_plan, real_refine = dtr._plan, dtr.refine_plan
    slept: list[bool] = []

    def recording_refine(plan, plan_time, work, rng, stop):
        out = real_refine(plan, plan_time, work, rng, stop)
        refined.append((plan_time, out[0]))
        return out

    def slow_plan(*args, **kwargs):
        if not slept:
            time.sleep(DEFAULTS.refine_share * deadline_s + 0.1)
            slept.append(True)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(dtr, "refine_plan", recording_refine)
    best_heuristic(p.with_budget(budget), FastOptions(deadline_s=deadline_s))
    monkeypatch.setattr(dtr, "_plan", slow_plan)
    best_heuristic(p.with_budget(budget), FastOptions(deadline_s=deadline_s))
    (before, after), (slow_before, slow_after) = refined
    assert after < before and (slow_before, slow_after) == (before, after)


def test_a_plan_gives_the_events_its_time_was_measured_on_after_the_deadline():
    """A plan's events are polished (recomputes kept where they fit) once per state of the plan: read again once the
    call's deadline has passed (ruin and recreate's best plan, read at its end), they are still those its time was
    measured on, not unpolished ones; a plan changed since is made into events anew (unpolished, past the
    deadline). The 100-op seed 1 DAG at 80%: its early plan's events take 1.7% longer unpolished."""
    import trainplan.schedule.dtr as dtr
    p, budget = _layered(100, 1)
    plan = dtr._plan(p, budget, dtr._Rules(False, dtr.MAX_CHAIN, early=True), dtr.Effort(dtr.dl.NEVER))
    t = plan.time()
    u, k, c = next((u, k, c) for u in range(p.n) for k, c in plan.evicted[u].items())

    def made_again() -> dtr._Plan:
        twin = plan.copy()
        twin.keep(u, k)
        twin.evict(u, k, c)
        return twin

    with dtr.dl.scope(dtr.dl.Deadline(0.0)):
        assert replay(p, plan.events(), budget).time == t
        assert replay(p, made_again().events(), budget).time > t
    assert made_again().time() == t


def _kind_best(p, budget: int, max_chain: int, *, hold: bool = False, restarts: int = 0):
    """The cheapest plan of one kind (recompute only; late, then early restores, then restarts) and its time."""
    import trainplan.schedule.dtr as dtr
    kind = dtr._Kind(max_chain, hold, 0)
    dtr._Search(p, budget, False, dtr.Effort(dtr.dl.NEVER), None).rest(kind, restarts)
    return kind.best


def _layered(n: int, seed: int, frac: float = 0.8):
    p = layered_graph(n, seed)
    return p, int(frac * replay(p, no_recompute_events(p)).peak_bytes)


def test_early_restores_recompute_before_the_next_reader_and_cost_less():
    """500 ops, seed 1, at 80%: restoring an evicted tensor right after the last over-budget step of its gap
    (where fewer of its ancestors are gone) instead of just before its next reader; the plan is valid and
    cheaper than the plan restoring only before readers."""
    import trainplan.schedule.dtr as dtr
    p, budget = _layered(500, 1)
    early = dtr._plan(p, budget, dtr._Rules(False, dtr.MAX_CHAIN, early=True), dtr.Effort(dtr.dl.NEVER))
    late = dtr._plan(p, budget, dtr._Rules(False, p.n, early=False), dtr.Effort(dtr.dl.NEVER))
    restores = [(u, k, c) for u in range(p.n) for k, c in early.evicted[u].items()]
    assert any(c < early.gaps.stops[u][k + 1] for u, k, c in restores)
    assert all(c == late.gaps.stops[u][k + 1] for u in range(p.n) for k, c in late.evicted[u].items())
    t_early = replay(p, early.events(), budget).time
    assert t_early == early.time() < replay(p, late.events(), budget).time


@pytest.mark.parametrize("hold", [False, True])
def test_keeping_every_evicted_gap_gives_back_the_plain_order(hold):
    """evict and keep are inverses: a plan with every gap kept again has the plain order's excess, no
    reserved reads or held inputs, no transient bytes and the plain order's over-budget count."""
    import trainplan.schedule.dtr as dtr
    p, budget = _layered(300, 2)
    plan = dtr._plan(p, budget, dtr._Rules(False, dtr.MAX_CHAIN, early=True, hold=hold), dtr.Effort(dtr.dl.NEVER))
    fresh = dtr._Plan(p, budget, dtr._Rules(False, dtr.MAX_CHAIN, True), dtr.Effort(dtr.dl.NEVER))
    assert plan.paid and plan.excess != fresh.excess
    assert any(plan.held_until(w) > plan.gaps.last[w] for w in range(p.n)) == hold
    for u, k in sorted(plan.paid):
        plan.keep(u, k)
    assert plan.excess == fresh.excess and plan.transient == fresh.transient
    assert all(not needs for needs in plan.needs_at) and not plan.chains and not plan.reads
    assert plan.counter.tree == fresh.counter.tree and plan.events() == fresh.events()


def test_holding_inputs_past_their_last_reader_finds_a_plan_where_recomputing_them_does_not():
    """The 100-op layered DAG, seed 0, at 80%: no plan recomputes its way through steps 83-91 (the chains reach
    back to op 0 and do not fit); keeping small inputs alive until their reader's recompute does. The plan
    frees a held input after the step whose restore reads it, replays within the budget and beats the greedy
    runs (220.9% there), and ruin and recreate keeps it valid."""
    import random

    import trainplan.schedule.dtr as dtr
    p = layered_graph(100, 0, swap=False)
    budget = int(0.8 * replay(p, no_recompute_events(p)).peak_bytes)
    for max_chain in (dtr.MAX_CHAIN, p.n):
        assert _kind_best(p, budget, max_chain, restarts=3) is None
    t0, plan = _kind_best(p, budget, dtr.MAX_CHAIN, hold=True, restarts=3)
    held = [w for w in range(p.n) if plan.held_until(w) > plan.gaps.last[w]]
    assert held
    events = plan.events()
    rep = replay(p, events, budget)
    assert rep.peak_bytes <= budget and rep.time == t0
    for w in held:  # on the device at the first compute of the step it is held through
        resident: set[str] = set()
        for kind, op in events:
            if kind == "compute" and op == p.ops[plan.held_until(w)].id:
                break
            if kind == "compute":
                resident.add(op)
            elif kind == "free":
                resident.discard(op)
        assert p.ops[w].id in resident
    greedy_times = [replay(p, e).time for e in (greedy(p, budget, allow_swap=False, policy=q) for q in POLICIES)
                    if e is not None]
    assert greedy_times and all(t0 < t for t in greedy_times)
    t1, better = dtr.refine_plan(plan.copy(), t0, 1_000_000, random.Random(0), dtr.dl.NEVER)
    assert t1 <= t0 and replay(p, better.events(), budget).time == t1


def test_ruin_and_recreate_improves_the_plan_and_is_reproducible():
    import random

    import trainplan.schedule.dtr as dtr
    p, budget = _layered(300, 2)
    t0, plan = _kind_best(p, budget, dtr.MAX_CHAIN)
    t1, better = dtr.refine_plan(plan.copy(), t0, 1_000_000, random.Random(3), dtr.dl.NEVER)
    assert t1 < t0 and plan.time() == t0  # the plan it started from is untouched
    assert replay(p, better.events(), budget).time == t1
    better.stop = dtr.dl.Deadline(0.0)  # refine's share of the time is over when its plan is read: still polished
    assert replay(p, better.events(), budget).time == t1
    assert dtr.refine_plan(plan.copy(), t0, 1_000_000, random.Random(3), dtr.dl.NEVER)[1].events() == better.events()
    assert dtr_plan(p, budget, DtrOptions(allow_swap=False, seed=3, refine=1_000_000)) is not None


def test_graphs_with_many_edges_get_the_larger_refinement_share(monkeypatch):
    """Ruin and recreate's work is REFINE_LARGE_SHARE of the heuristics' time on graphs with more than
    REFINE_LARGE_EDGES input edges (where window LNS gains little), REFINE_SHARE below."""
    from dataclasses import replace

    import trainplan.schedule.dtr as dtr
    from trainplan.schedule.context import FastOptions
    from trainplan.schedule.portfolio import best_heuristic
    from trainplan.schedule.settings import DEFAULTS
    p, budget = _layered(300, 2)
    edges = sum(map(len, p.inputs))
    works: list[int] = []
    real_refine = dtr.refine_plan

    def recording_refine(plan, plan_time, work, rng, stop):
        works.append(work)
        return real_refine(plan, plan_time, 0, rng, stop)  # the work asked for is what is checked

    monkeypatch.setattr(dtr, "refine_plan", recording_refine)
    for threshold in (edges, edges - 1):
        best_heuristic(p.with_budget(budget), FastOptions(deadline_s=1.0), settings=replace(DEFAULTS,
                       refine_large_edges=threshold))
    assert works == [int(share * DEFAULTS.refine_work_per_second)
                     for share in (DEFAULTS.refine_share, DEFAULTS.refine_large_share)]


def test_kept_chain_walks_answer_as_fresh_walks_do():
    """A plan keeps each restore's walk over its missing ancestors while the residency of what it looked at is
    unchanged: on a refined plan that holds inputs (gaps evicted and kept again, inputs held and let go), every
    kept walk gives the chain a plan without kept walks finds, at any cost cap; and the holds' fit, checked
    stretch by stretch, agrees with a step-by-step count."""
    import random

    import trainplan.schedule.dtr as dtr
    p, budget = _layered(300, 2)
    plan = dtr._plan(p, budget, dtr._Rules(False, dtr.MAX_CHAIN, early=True, hold=True), dtr.Effort(dtr.dl.NEVER))
    t0 = plan.time()
    _, plan = dtr.refine_plan(plan.copy(), t0, 300_000, random.Random(1), dtr.dl.NEVER)
    fresh = dtr._Plan(p, budget, dtr._Rules(False, dtr.MAX_CHAIN, True, hold=True), dtr.Effort(dtr.dl.NEVER))
    partial = fresh.copy()  # half the plan's gaps evicted: steps over the budget, restores' transient bytes
    for (u, k), c in sorted(((u, k), c) for u in range(p.n) for k, c in plan.evicted[u].items())[::2]:
        if partial.cost(u, k, c)[0] < dtr.INF:
            partial.evict(u, k, c)
    assert len(plan.walks) > 100 and any(partial.transient) and max(partial.excess) > 0
    jolted = plan.copy()  # room on every step, and restores' bytes there up to twice an op's: the fit's
    rng = random.Random(0)  # terms other than the gap (made-up tables, checked only by the fit's two versions)
    big = max(op.bytes + op.workspace for op in p.ops)
    jolted.transient = [rng.randint(0, 2 * big) for _ in p.ops]
    jolted.excess = [e - rng.randint(0, 4 * big) for e in plan.excess]
    checked = fits = 0
    for start in (fresh, partial, jolted, plan):
        for u, b, hold in sorted(plan.walks):
            cold = start.copy()
            cold.walks = {}
            for cap in (dtr.INF, p.ops[u].time * 3):
                kept, new = start.chain(u, b, cap, hold), cold.chain(u, b, cap, hold)
                assert (kept is None) == (new is None)
                if kept is not None:
                    checked += 1
                    assert (kept.time, kept.order, kept.reads, kept.peak) == (new.time, new.order, new.reads, new.peak)
                    # the walk's own residency test (inlined) agrees with the plan's
                    assert all(read == cold._resident_or_held(w, b, hold) for w, read in zip(new.seen, new.read))
            k = start.gaps.covering(u, b - 1) if b - 1 > u else None
            walk = start.chain(u, b, hold=True) if start.hold else None
            if k is not None and walk is not None:
                fits += start._holds_fit(u, k, b, walk)
                assert start._holds_fit(u, k, b, walk) == _holds_fit_by_steps(start, u, k, b, walk)
    assert checked > 100 and 0 < fits


def _holds_fit_by_steps(plan, u, k, c, walk):
    """_Plan._holds_fit, one step at a time."""
    p, a, size = plan.p, plan.gaps.stops[u][k], plan.p.ops[u].bytes
    starts = [(plan.held_until(w) + 1, p.ops[w].bytes) for w in walk.reads if plan.held_until(w) < c]
    if not starts:
        return True
    held = 0
    for t in range(min(s for s, _ in starts), c + 1):
        held = sum(b for s, b in starts if s <= t)
        if a < t < c and held >= size:
            return False
        if not a < t < c and max(plan.excess[t], plan.restoring(t)) + held > 0:
            return False
    return plan.restoring(c) + held + chain_peak(p, walk.order) <= 0


def test_the_last_step_over_the_budget_is_found_by_one_descent():
    import random

    import trainplan.schedule.dtr as dtr
    rng = random.Random(0)
    for n in (1, 2, 7, 64, 100):
        flags = [rng.random() < 0.3 for _ in range(n)]
        counter = dtr._Counter(flags)
        for b in range(n + 1):
            assert counter.last_before(b) == max([i for i in range(b) if flags[i]], default=-1)


def test_a_raised_plan_is_its_kind_s_plan_where_that_fits_and_raises_its_budget_where_it_is_stuck():
    """The plan for a bisection's upper end: at 80% of the plain peak of the 100-op layered DAG (recompute only)
    its kind's late plan fits, and it is that plan; at 1.1x the memory floor no DTR-style plan fits, and it
    raises its budget to a valid schedule between the two, or gives nothing where that would pass its ceiling;
    out of work, the plan so far, still valid; past the deadline, nothing."""
    import time

    import trainplan.schedule.dtr as dtr
    p = layered_graph(100, 0, swap=False)
    peak = replay(p, no_recompute_events(p)).peak_bytes
    budget = int(0.8 * peak)
    plan = dtr._plan(p, budget, dtr._Rules(False, dtr.MAX_CHAIN, early=False, hold=True), dtr.Effort(dtr.dl.NEVER))
    assert plan is not None and plan.time() is not None
    assert dtr.raised_plan(p, budget, 1, peak, allow_swap=False) == plan.events()
    low = int(1.1 * p.floor_bytes)
    assert dtr_plan(p, low, DtrOptions(allow_swap=False)) is None
    raised = replay(p, dtr.raised_plan(p, low, 1, peak, allow_swap=False)).peak_bytes
    assert low < raised < peak
    assert dtr.raised_plan(p, low, 1, (low + raised) // 2, allow_swap=False) is None
    meter = [0]
    full = dtr.raised_plan(p, low, 1, peak, allow_swap=False, effort=dtr.Effort(meter=meter))
    short = dtr.raised_plan(p, low, 1, peak, allow_swap=False, effort=dtr.Effort(work_cap=meter[0] // 10))
    assert short is not None and short != full and replay(p, short).peak_bytes > low  # the plan cut short, valid
    assert dtr.raised_plan(p, low, 1, peak, effort=dtr.Effort(dtr.dl.Deadline(time.perf_counter() - 1))) is None
