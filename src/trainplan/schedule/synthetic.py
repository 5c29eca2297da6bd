"""Seeded synthetic problems: small random DAGs (tests) and layered training-step graphs (bench)."""

from __future__ import annotations

import random

from trainplan.schedule.problem import Op, Problem

MIB = 2**20


def random_dag(n: int, seed: int, *, flags: bool = True) -> Problem:
    """A small random DAG with integer-ish times and bytes; budget set to the no-recompute peak."""
    rng = random.Random(seed)
    ops = []
    for i in range(n):
        k = rng.randint(1, min(2, i)) if i else 0
        inputs = tuple(f"o{j}" for j in sorted(rng.sample(range(i), k)))
        ops.append(Op(f"o{i}", float(rng.randint(1, 5)), rng.randint(1, 8) * 10, inputs,
                      workspace=rng.choice([0, 0, 10]),
                      recompute=not flags or rng.random() > 0.15, swap=not flags or rng.random() > 0.15))
    return Problem(tuple(ops), budget_bytes=10**9, bandwidth=float(rng.choice([10, 20, 40])),
                   fixed_bytes=rng.choice([0, 5]), keep=(f"o{n - 1}",))


def training_graph(n: int, seed: int, *, bandwidth: float = 1.6e10) -> Problem:
    """Forward chain with skip connections, a loss, and a mirrored backward reading forward activations.

    Forward op f_i reads f_{i-1} (and f_{i-s} for a skip, s in 2..4, with probability 0.3);
    backward op g_i reads g_{i+1}, f_i and f_{i-1}. About n ops in total; the last gradient is kept.
    Times are 0.1-2 ms, activations 1-32 MiB, so a swap costs about as much as a recompute.
    """
    rng = random.Random(seed)
    layers = max(2, (n - 2) // 2)
    ops = [Op("input", 1e-5, 4 * MIB, (), recompute=False)]
    fwd = ["input"]
    for i in range(1, layers + 1):
        ins = [fwd[i - 1]]
        if i > 4 and rng.random() < 0.3:
            ins.append(fwd[i - rng.randint(2, 4)])
        ops.append(Op(f"f{i}", rng.uniform(1e-4, 2e-3), rng.randint(1, 32) * MIB, tuple(ins),
                      workspace=rng.choice([0, 0, 0, MIB])))
        fwd.append(f"f{i}")
    ops.append(Op("loss", 1e-4, MIB, (fwd[-1],)))
    prev = "loss"
    for i in range(layers, 0, -1):
        ins = (prev, fwd[i], fwd[i - 1])
        ops.append(Op(f"g{i}", rng.uniform(2e-4, 4e-3), rng.randint(1, 32) * MIB, ins))
        prev = f"g{i}"
    return Problem(tuple(ops), budget_bytes=10**15, bandwidth=bandwidth, fixed_bytes=64 * MIB, keep=(prev,))
