"""The exact knapsack for torch.compile's activation-memory partitioner: optimal against brute force, and called
by the partitioner, whose compiled step then gives eager's gradients."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch._functorch.config as functorch_config

from trainplan.loop.knapsack import ExactKnapsack, solve_knapsack


@contextmanager
def exact_knapsack_at(budget: float, solver: ExactKnapsack) -> Iterator[None]:
    """torch.compile with the activation budget and the solver, no compile caches (a cached graph skips the
    partitioner), on fresh dynamo state."""
    torch._dynamo.reset()
    with functorch_config.patch(activation_memory_budget=budget, activation_memory_budget_solver=solver,
                                enable_autograd_cache=False), torch._inductor.config.patch(fx_graph_cache=False):
        yield
    torch._dynamo.reset()


@pytest.mark.parametrize("seed", range(5))
def test_the_knapsack_is_optimal_against_every_subset(seed):
    rng = random.Random(seed)
    memory = [rng.uniform(0.05, 1.0) for _ in range(11)]
    runtimes = [rng.uniform(0.01, 1.0) for _ in range(11)]
    cap = sum(memory) * rng.uniform(0.2, 0.6)
    saved, recomputed, proven = solve_knapsack(memory, runtimes, cap, time_limit_s=10)
    assert proven and sorted(saved + recomputed) == list(range(11))
    assert sum(memory[i] for i in saved) <= cap
    best = max(sum(runtimes[i] for i in subset) for k in range(12) for subset in itertools.combinations(range(11), k)
               if sum(memory[i] for i in subset) <= cap)
    assert sum(runtimes[i] for i in saved) == pytest.approx(best, rel=1e-5)  # integer scaling: 6 digits


def test_torch_compile_runs_the_exact_knapsack_and_trains_as_eager():
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(4)])
    x = torch.randn(32, 64)
    net(x).pow(2).mean().backward()
    eager = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    solver = ExactKnapsack(time_limit_s=5)
    with exact_knapsack_at(0.3, solver):
        torch.compile(net)(x).pow(2).mean().backward()
    assert solver.proven == [True]  # the partitioner called it once, and its answer is optimal
    for p, want in zip(net.parameters(), eager):
        torch.testing.assert_close(p.grad, want, rtol=1e-5, atol=1e-6)


def test_the_exact_knapsack_compiles_a_model_with_an_embedding():
    """Tiny GPT-2: the runtimes are read from the traced shapes, not by running the candidates (the partitioner's
    own estimator, called without dispatch, ran an embedding on uninitialized indices); gradients as eager's."""
    from tests.test_plan_api import TINY
    from trainplan.models import build_model

    built = build_model("tiny_gpt2", TINY, seed=0)
    built.module.loss_type = "ForCausalLM"
    built.module(**built.batch).loss.backward()
    eager = [p.grad.clone() for p in built.module.parameters()]
    built.module.zero_grad()
    solver = ExactKnapsack(time_limit_s=5)
    with exact_knapsack_at(0.3, solver):
        torch.compile(built.module)(**built.batch).loss.backward()
    assert solver.proven and all(solver.proven)
    for p, want in zip(built.module.parameters(), eager):
        torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=1e-5)
