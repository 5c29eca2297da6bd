"""The CP-SAT schedule model of a random layered DAG on its DTR plan's grid, with the plan as hint, for the LNS
and sub-model tests."""

from __future__ import annotations

from trainplan.schedule import replay
from trainplan.schedule.baselines import no_recompute_events
from trainplan.schedule.dtr import DtrOptions, dtr_plan
from trainplan.schedule.mip import _add_hint, _build, _grid, byte_unit, copies_from_events
from trainplan.schedule.synthetic import layered_graph


def dtr_model(n: int, seed: int, fraction: float):
    """The layered DAG of ``n`` ops (``seed``, recompute only) at ``fraction`` of its plain peak, its grid and its
    model hinted with the DTR plan: (problem, grid, model)."""
    p = layered_graph(n, seed)
    p = p.with_budget(int(fraction * replay(p, no_recompute_events(p)).peak_bytes))
    plan = dtr_plan(p, p.budget_bytes, DtrOptions(allow_swap=False))
    hint_copies, cover, used = copies_from_events(p, plan)
    g = _grid(p, None, None, hint_copies, used, None)
    model = _build(p, g, p.budget_bytes - p.fixed_bytes, byte_unit(p.budget_bytes), 0)
    _add_hint(p, g, model, hint_copies, cover)
    return p, g, model
