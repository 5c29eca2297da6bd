"""The LNS sub-model (schedule/submodel.py) against an independent reference, the whole model cloned with the
same variables fixed: with the exact memory profile both have the same optimum; with the merged profile the
sub-model is never better, and its answer, put back into the solution, satisfies the whole model and replays as a
valid schedule within the budget. The clone LNS uses on smaller models has the reference's optimum too."""

from __future__ import annotations

import random

import pytest
from ortools.sat.python import cp_model

from schedule_models import dtr_model
from trainplan.schedule import lns, replay, submodel
from trainplan.schedule.mip import _decode, _Values


@pytest.fixture(autouse=True)
def small_op_sets(monkeypatch):
    monkeypatch.setattr(lns, "OP_SET", 8)


@pytest.fixture(scope="module")
def start():
    """The 100-op layered DAG (seed 1) at 80% of the plain peak, its model on the DTR plan's grid, and that plan
    as a solution of it (CP-SAT's first answer from the complete hint)."""
    p, g, model = dtr_model(100, 1, 0.8)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers, solver.parameters.max_deterministic_time = 1, 0.05
    assert solver.Solve(model.m) == cp_model.FEASIBLE
    return p, g, model, list(solver.ResponseProto().solution)


def _neighbourhoods(p, g, model, solution):
    """Three windows of 8-16 blocks (the second improves the start) and two op neighbourhoods of 8 ops of
    ``solution``, as (free copies, lo, hi): small enough for CP-SAT to prove optima in the whole model too."""
    out = [(lns._free_copies(model, g.fpos, solution, g.base[a], g.base[a + w]), g.base[a], g.base[a + w])
           for a, w in ((20, 8), (48, 16), (80, 16))]
    rng = random.Random(3)
    for seed_op in rng.sample(lns._rematerialised(model, solution), 2):
        out.append((lns._op_free(model, lns._op_set(model, p.inputs, solution, seed_op)), 0, g.horizon))
    return out


def _fixed_clone(model, solution, free, narrowed):
    """The reference: the whole model with every variable not in ``free`` fixed to ``solution``."""
    ref = model.m.Clone()
    proto, keep = ref.Proto(), set(free)
    for v in range(len(proto.variables)):
        if v in narrowed or v not in keep:
            lo, hi = narrowed.get(v, (solution[v], solution[v]))
            proto.variables[v].domain.clear()
            proto.variables[v].domain.extend([lo, hi])
    return ref


def _optimum(model):
    solver = cp_model.CpSolver()
    solver.parameters.num_workers, solver.parameters.max_time_in_seconds = 2, 60
    assert solver.Solve(model) == cp_model.OPTIMAL
    return round(solver.ObjectiveValue()), list(solver.ResponseProto().solution)


def test_with_the_exact_profile_a_sub_model_has_the_optimum_of_the_whole_model_with_the_same_variables_fixed(
        start, monkeypatch):
    p, g, model, solution = start
    monkeypatch.setattr(submodel, "PROFILE_SLACK", 0.0)
    reducer, copies = submodel.Reducer(model.m), lns._Copies(model)
    incumbent = _optimum(_fixed_clone(model, solution, [], {}))[0]
    gains = 0
    for free, lo, hi in _neighbourhoods(p, g, model, solution):
        free_vars, narrowed = lns._free_vars(model, copies, reducer.domains, lns.Neighbourhood(free, lo, hi), solution)
        sub, _ = reducer.sub_model(solution, free_vars, narrowed)
        assert len(sub.Proto().variables) == len(free_vars) < len(solution)
        best, _ = _optimum(sub)
        assert best == _optimum(_fixed_clone(model, solution, free_vars, narrowed))[0]
        gains += best < incumbent
    assert gains  # some neighbourhood improves the start, so the optima compared are not the start's


def test_below_the_threshold_the_clone_of_the_whole_model_has_the_same_optimum(start):
    """Below SUBMODEL_ABOVE, LNS clones the whole model and fixes the same neighbourhood (lns._sub_model): its
    optimum is the reference's, absent free copies allowed to start in the window included."""
    p, g, model, solution = start
    reducer, copies = submodel.Reducer(model.m), lns._Copies(model)
    for free, lo, hi in _neighbourhoods(p, g, model, solution):
        free_vars, narrowed = lns._free_vars(model, copies, reducer.domains, lns.Neighbourhood(free, lo, hi), solution)
        clone, n_free = lns._sub_model(model, copies, lns.Neighbourhood(free, lo, hi), solution)
        assert n_free > 0
        assert _optimum(clone)[0] == _optimum(_fixed_clone(model, solution, free_vars, narrowed))[0]


def test_with_merged_levels_a_sub_model_is_never_better_and_its_answer_is_a_valid_schedule(start):
    p, g, model, solution = start
    assert submodel.PROFILE_SLACK > 0
    reducer, copies = submodel.Reducer(model.m), lns._Copies(model)
    for free, lo, hi in _neighbourhoods(p, g, model, solution):
        free_vars, narrowed = lns._free_vars(model, copies, reducer.domains, lns.Neighbourhood(free, lo, hi), solution)
        sub, _ = reducer.sub_model(solution, free_vars, narrowed)
        best, values = _optimum(sub)
        assert best >= _optimum(_fixed_clone(model, solution, free_vars, narrowed))[0]
        whole = list(solution)
        for v, value in zip(free_vars, values):
            whole[v] = value
        check = _fixed_clone(model, whole, [], {})  # every variable fixed: feasible iff the answer is
        assert _optimum(check)[0] == best
        events = _decode(p, _Values(whole), g.horizon, model)
        assert replay(p, events, p.budget_bytes).peak_bytes <= p.budget_bytes


def _random_model(rng: random.Random) -> cp_model.CpModel:
    """A small model with every kind of constraint the schedule model uses: clauses, implications, enforced
    linear rows, optional intervals in a no-overlap and a cumulative, and a linear objective."""
    m = cp_model.CpModel()
    xs = [m.NewIntVar(0, 12, f"x{i}") for i in range(6)]
    bs = [m.NewBoolVar(f"b{i}") for i in range(6)]
    lits = bs + [b.Not() for b in bs]
    for _ in range(3):
        m.AddBoolOr(rng.sample(lits, 3))
        m.AddImplication(rng.choice(lits), rng.choice(lits))
        i, j = rng.sample(range(6), 2)
        m.Add(xs[i] + 2 * xs[j] <= rng.randint(8, 20)).OnlyEnforceIf(rng.choice(lits))
    sizes = [m.NewIntVar(1, 3, f"l{i}") for i in range(6)]
    ends = [m.NewIntVar(1, 15, f"e{i}") for i in range(6)]
    ivs = [m.NewOptionalIntervalVar(xs[i], sizes[i], ends[i], bs[i], f"i{i}") for i in range(6)]
    m.AddNoOverlap(ivs[:3])
    m.AddCumulative(ivs, [rng.randint(1, 4) for _ in ivs], 5)
    m.Add(sum(bs) >= 3)
    m.Minimize(sum(rng.randint(-3, 3) * x for x in xs) + sum(rng.randint(-5, 5) * b for b in bs))
    return m


@pytest.mark.parametrize("slack", [0.0, 0.3])
def test_on_random_small_models_a_sub_model_matches_the_whole_model_with_the_same_variables_fixed(slack,
                                                                                                 monkeypatch):
    """Every constraint kind, fixed in every way: the exact profile gives the reference's optimum; merged levels
    one no better, whose answer satisfies the whole model."""
    monkeypatch.setattr(submodel, "PROFILE_SLACK", slack)
    rng, compared = random.Random(11), 0
    for _ in range(40):
        m = _random_model(rng)
        solver = cp_model.CpSolver()
        solver.parameters.num_workers, solver.parameters.random_seed = 1, rng.randint(0, 99)
        solver.parameters.stop_after_first_solution = True
        if solver.Solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            continue
        solution = list(solver.ResponseProto().solution)
        reducer = submodel.Reducer(m)
        for _ in range(3):
            free = sorted(rng.sample(range(len(solution)), rng.randint(1, len(solution) - 1)))
            sub, _ = reducer.sub_model(solution, free, {})
            best, values = _optimum(sub)
            reference = _optimum(_fixed_clone(_Wrap(m), solution, free, {}))[0]
            assert best == reference if slack == 0 else best >= reference
            whole = list(solution)
            for v, value in zip(free, values):
                whole[v] = value
            assert _optimum(_fixed_clone(_Wrap(m), whole, [], {}))[0] == best
            compared += 1
    assert compared >= 60


class _Wrap:
    """A bare CpModel where _fixed_clone expects a schedule model (``.m``)."""

    def __init__(self, m: cp_model.CpModel) -> None:
        self.m = m
