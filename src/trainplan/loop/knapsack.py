"""An exact solver for ``torch.compile``'s activation-memory partitioner, the one hook it offers.

With ``torch._functorch.config.activation_memory_budget`` below 1, the partitioner picks which candidate
activations to save and which to recompute by a 0-1 knapsack: keep the saved ones' memory within the budget,
recompute the rest at the least runtime. Its own solvers are a quantized DP (the default), greedy and an ILP
(with scipy). :class:`ExactKnapsack` solves the same knapsack with OR-Tools' CP-SAT, to optimality or within
its time limit, on the partitioner's own memory estimates and its default (FLOP) runtime estimates:

    torch._functorch.config.activation_memory_budget = 0.3
    torch._functorch.config.activation_memory_budget_solver = ExactKnapsack(time_limit_s=10)

What the hook cannot take is a schedule: it passes each candidate's memory as one number, with no liveness
(when it is freed, when it is recomputed), so trainplan's plans, which decide both, stay in ``trainplan.plan``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from ortools.sat.python import cp_model
from torch._inductor.custom_graph_pass import CustomKnapsackSolver
from torch.utils.flop_counter import flop_registry

#: integer units per unit of memory and of runtime: CP-SAT needs integers; the partitioner's memory is in GB
#: and its runtimes in its estimator's units, so 1e6 keeps 6 significant digits of either (a finer scale
#: only slows the solve)
SCALE = 10**6


def solve_knapsack(memory: list[float], runtimes: list[float], max_memory: float, *, time_limit_s: float,
                   workers: int = 1, seed: int = 0) -> tuple[list[int], list[int], bool]:
    """Indices saved and recomputed: the saved ones' memory within ``max_memory``, the recomputed ones' runtime
    least; and whether that is proven optimal (else: the best found in ``time_limit_s``)."""
    model = cp_model.CpModel()
    save = [model.NewBoolVar(f"save{i}") for i in range(len(memory))]
    model.Add(sum(round(m * SCALE) * s for m, s in zip(memory, save)) <= int(max_memory * SCALE))
    model.Maximize(sum(round(r * SCALE) * s for r, s in zip(runtimes, save)))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):  # saving nothing is always feasible
        return [], list(range(len(memory))), False
    saved = [i for i, s in enumerate(save) if solver.Value(s)]
    recomputed = [i for i, s in enumerate(save) if not solver.Value(s)]
    return saved, recomputed, status == cp_model.OPTIMAL


def flop_runtime(node: torch.fx.Node) -> float:
    """The partitioner's ``"flops"`` runtime estimate of a candidate, read from the traced shapes: the op's FLOPs
    by PyTorch's flop-counter formulas, at least 1. (The partitioner's own ``estimate_runtime`` runs the op on
    materialized tensors, which its call of a custom solver, made without dispatch, turns into real ones:
    an embedding then reads uninitialized indices.)"""
    packet = getattr(node.target, "overloadpacket", None)
    if packet not in flop_registry:
        return 1.0
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
    return float(max(flop_registry[packet](*args, **kwargs, out_val=node.meta.get("val")), 1))


class ExactKnapsack(CustomKnapsackSolver):
    """``activation_memory_budget_solver`` for ``torch.compile``: :func:`solve_knapsack` on the partitioner's
    candidates and memory, runtimes by :func:`flop_runtime` (the partitioner's default estimator's)."""

    def __init__(self, time_limit_s: float = 10.0, workers: int = 1, seed: int = 0) -> None:
        self.time_limit_s, self.workers, self.seed = time_limit_s, workers, seed
        self.proven: list[bool] = []  # per call: whether the answer was proven optimal

    def __call__(self, memory: list[float], joint_graph: torch.fx.Graph, max_memory: float, node_info: Any,
                 all_recomputable_banned_nodes: list[torch.fx.Node]) -> tuple[list[int], list[int]]:
        runtimes = [flop_runtime(n) for n in all_recomputable_banned_nodes]
        saved, recomputed, proven = solve_knapsack(memory, runtimes, max_memory, time_limit_s=self.time_limit_s,
                                                   workers=self.workers, seed=self.seed)
        self.proven.append(proven)
        return saved, recomputed

    def uuid(self) -> str:
        """The compile cache's key: this file and the solver's settings."""
        text = Path(__file__).read_bytes() + repr((self.time_limit_s, self.workers, self.seed)).encode()
        return hashlib.sha256(text).hexdigest()
