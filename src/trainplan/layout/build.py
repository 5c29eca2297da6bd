"""The layout problem of a measured model: conv groups as nodes, graph edges with measured transforms."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from trainplan.layout.graph import INPUT
from trainplan.layout.problem import LayoutProblem, LayoutProblemError, problem_from_dict


def node_costs(convs: pd.DataFrame, groups: pd.DataFrame, layouts: list[str],
               conv_time: pd.DataFrame | None = None) -> dict[str, dict[str, float]]:
    """Per conv group and layout: conv forward+backward (``conv_time`` columns ``<layout>`` when given, e.g.
    predicted, else the measured ``fwd_``/``bwd_`` columns) plus its group's ops forward+backward. A group
    whose replay failed in one layout is costed as measured in the other (measured-equal); in none, 0. A layout
    the conv has no measured time in (PyTorch refused or crashed on it: ``error``) is not among its choices."""
    ops: dict[str, dict[str, float]] = {}
    for row in groups.itertuples(index=False):
        vals = {lay: getattr(row, f"fwd_{lay}") + getattr(row, f"bwd_{lay}") for lay in layouts}
        ok = [v for v in vals.values() if not math.isnan(v)]
        ops[row.group] = {lay: (v if not math.isnan(v) else (min(ok) if ok else 0.0)) for lay, v in vals.items()}
    cost: dict[str, dict[str, float]] = {}
    for row in convs.itertuples(index=False):
        runs = [lay for lay in layouts if not math.isnan(getattr(row, f"fwd_{lay}") + getattr(row, f"bwd_{lay}"))]
        if not runs:
            raise LayoutProblemError(f"conv '{row.conv}' has no measured time in any layout of {layouts}: "
                                     f"{getattr(row, 'error', '') or 'no times'}")
        for lay in runs:
            conv = (float(conv_time.loc[row.conv, lay]) if conv_time is not None
                    else getattr(row, f"fwd_{lay}") + getattr(row, f"bwd_{lay}"))
            cost.setdefault(row.conv, {})[lay] = conv + ops.get(row.conv, {}).get(lay, 0.0)
    return cost


def build_problem(model: str, convs: pd.DataFrame, groups: pd.DataFrame, edges: pd.DataFrame,
                  layouts: list[str], conv_time: pd.DataFrame | None = None, meta: dict[str, Any] | None = None
                  ) -> LayoutProblem:
    """The problem file of a model: node ``input`` fixed to NCHW (the batch as given), one node per conv."""
    cost = node_costs(convs, groups, layouts, conv_time)
    input_ops = groups.set_index("group").loc[INPUT] if INPUT in set(groups.group) else None
    input_cost = 0.0 if input_ops is None else float(input_ops["fwd_nchw"] + input_ops["bwd_nchw"])
    nodes = [{"id": INPUT, "cost": {"nchw": input_cost}, "fixed": "nchw"}]
    nodes += [{"id": n, "cost": c} for n, c in cost.items()]
    edge_list = [{"src": r["src"], "dst": r["dst"],
                  "transform": {f"{a}->{b}": float(r[f"{a}->{b}"]) for a in layouts for b in layouts if a != b}}
                 for _, r in edges.iterrows()]
    data = {"layouts": layouts, "nodes": nodes, "edges": edge_list, "meta": {"model": model, **(meta or {})}}
    return problem_from_dict(data, f"layout problem of model '{model}'")
