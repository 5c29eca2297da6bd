"""Random layout problems (chains and residual/concat DAGs) for tests and the benchmark."""

from __future__ import annotations

import random
from typing import Any

from trainplan.layout.problem import LayoutProblem, problem_from_dict


def random_problem(n: int, seed: int = 0, layouts: tuple[str, ...] = ("nchw", "nhwc"), kind: str = "dag",
                   skip_prob: float = 0.3, fixed_prob: float = 0.05) -> LayoutProblem:
    """``n`` nodes in a line (``kind='chain'``) or a DAG where each node follows its predecessor and, with
    ``skip_prob``, also joins an earlier node (residual add / concat); node times and per-edge transform times
    are drawn per layout so that neighbours disagree on their best layout; some nodes have a fixed layout."""
    rng = random.Random(seed)
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    for i in range(n):
        base = rng.lognormvariate(0, 1) * 1e-3
        node: dict[str, Any] = {"id": f"n{i}", "cost": {lay: base * rng.uniform(0.6, 1.4) for lay in layouts}}
        if i and rng.random() < fixed_prob:
            node["fixed"] = rng.choice(layouts)
        nodes.append(node)
        if not i:
            continue
        sources = {i - 1}
        if kind == "dag" and i >= 3 and rng.random() < skip_prob:
            sources.add(rng.randrange(max(0, i - 8), i - 1))
        for j in sorted(sources):
            size = rng.lognormvariate(0, 1) * 2e-4
            edges.append({"src": f"n{j}", "dst": f"n{i}", "transform": {
                f"{a}->{b}": size * rng.uniform(0.8, 1.2) for a in layouts for b in layouts if a != b}})
    return problem_from_dict({"layouts": list(layouts), "nodes": nodes, "edges": edges}, f"random(n={n}, seed={seed})")
