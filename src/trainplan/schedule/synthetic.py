"""Seeded synthetic problems: small random DAGs (tests), layered training-step graphs and random layered DAGs (bench)."""

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


LAYERED_MAX_DEGREE = 25  # fan-in and fan-out cap of the layered graphs
LAYERED_BYTES = (10, 7400)  # output size range (units of bytes)
LAYERED_TIME = (1, 1000)  # op time range (units of seconds), for ops that are not zero-time
LAYERED_ZERO_TIME = 0.1  # share of zero-time ops (reshapes, views)
LAYERED_MEAN_EXTRA_INPUTS = 2.0  # fan-in: 1 + an exponential draw of this mean, capped (most ops read 1-4)
LAYERED_SKIP = 0.2  # share of an op's extra inputs drawn from any earlier layer (long skip edges)


def layered_graph(n: int, seed: int, *, swap: bool = False, bandwidth: float = 7.4) -> Problem:
    """A random layered DAG of ``n`` ops after Appendix A of Gagrani et al., "Neural Topological Ordering
    for Computation Graphs" (NeurIPS 2022), the generator Moccasin's evaluation (Bartan et al. 2023) uses.

    Followed from the papers' text as summarised in issue #24 (their generator code was not found in the
    searchable public corpus, so the distributions below are this module's reading, not a copy): the ops
    are cut into layers of random width (mean ~sqrt(n), so the graph is wide); every op of layer l > 0
    reads at least one op of layer l - 1 and has 1 + Exp(LAYERED_MEAN_EXTRA_INPUTS) inputs in all (at most
    LAYERED_MAX_DEGREE), most from the three layers before it and a LAYERED_SKIP share from any earlier
    layer (long skip edges); an op no later op reads is given a reader in a later layer (fan-out capped
    likewise), so the single op of the last layer is the only sink, and it is kept. Output sizes are
    uniform in LAYERED_BYTES, times uniform in LAYERED_TIME with a LAYERED_ZERO_TIME share of zero-time
    ops. Program order is layer by layer (a plain topological order). ``swap=False`` marks every op
    ``swap: false`` (recompute only); ``bandwidth`` (bytes per time unit) makes a transfer of a mean-sized
    output cost about a mean op time. ``budget_bytes`` is a placeholder: set it from the plain peak."""
    rng = random.Random(seed)
    mean_width = max(2, round(n ** 0.5))
    widths: list[int] = []
    left = n - 1  # the last layer is the one sink
    while left > 0:
        w = min(left, rng.randint(1, 2 * mean_width - 1))
        widths.append(w)
        left -= w
    widths.append(1)
    layers: list[list[int]] = []
    start = 0
    for w in widths:
        layers.append(list(range(start, start + w)))
        start += w
    layer_of = [li for li, layer in enumerate(layers) for _ in layer]
    inputs: list[set[int]] = [set() for _ in range(n)]
    fan_out = [0] * n
    for li in range(1, len(layers)):
        recent = [u for layer in layers[max(0, li - 3):li] for u in layer]
        earlier = [u for layer in layers[:li] for u in layer]
        for v in layers[li]:
            want = min(LAYERED_MAX_DEGREE, len(earlier), 1 + int(rng.expovariate(1 / LAYERED_MEAN_EXTRA_INPUTS)))
            pool = [u for u in layers[li - 1] if fan_out[u] < LAYERED_MAX_DEGREE] or layers[li - 1]
            picks = {rng.choice(pool)}
            for _ in range(4 * want):
                if len(picks) >= want:
                    break
                u = rng.choice(earlier if rng.random() < LAYERED_SKIP else recent)
                if fan_out[u] < LAYERED_MAX_DEGREE:
                    picks.add(u)
            for u in picks:
                inputs[v].add(u)
                fan_out[u] += 1
    for u in range(n - 1):  # every op but the sink gets a reader in a later layer
        if fan_out[u] == 0:
            later = [v for layer in layers[layer_of[u] + 1:] for v in layer if len(inputs[v]) < LAYERED_MAX_DEGREE]
            v = rng.choice(later or layers[-1])
            inputs[v].add(u)
            fan_out[u] += 1
    ops = []
    for v in range(n):
        time = 0.0 if rng.random() < LAYERED_ZERO_TIME else float(rng.randint(*LAYERED_TIME))
        ops.append(Op(f"n{v}", time, rng.randint(*LAYERED_BYTES), tuple(f"n{u}" for u in sorted(inputs[v])),
                      recompute=True, swap=swap))
    return Problem(tuple(ops), budget_bytes=10**15, bandwidth=bandwidth, keep=(f"n{n - 1}",))
