"""Groups split at their single-edge cuts (trainplan.fuse.split): pieces keep the seed's rule (checked by the
independent checker), are the fewest within the cap, and give a fused model's plan finer recompute choices."""

from __future__ import annotations

import random

import pytest
import torch

import trainplan
from tests.conftest import TINY_RESNET
from trainplan.fuse import build_graph, fuse_graph
from trainplan.fuse.check import check_grouping
from trainplan.fuse.planned import fused_spec
from trainplan.fuse.split import cuts, split_groups
from trainplan.fuse.synthetic import random_dag, random_mask
from trainplan.models import build_model


def _residual_chain(blocks: int):
    """Stem ``s``, then per block k: ``c1_k``, ``c2_k`` and ``add_k`` reading ``c2_k`` and the block's input (the
    residual), ``r_k`` its ReLU: the block's input is read by two ops, as in ResNet."""
    names, edges, x = ["s"], [], "s"
    for k in range(blocks):
        c1, c2, add, r = (f"{p}_{k}" for p in ("c1", "c2", "add", "r"))
        names += [c1, c2, add, r]
        edges += [(x, c1), (c1, c2), (c2, add), (x, add), (add, r)]
        x = r
    return build_graph(names, ["op"] * len(names), edges)


def _doc(graph, fusion):
    return fusion.to_dict(graph)["groups"]


def _check(graph, eligible, groups, **kw):
    edges = [(graph.names[u], graph.names[v]) for u, v in graph.edges()]
    return check_grouping(graph.names, edges, {graph.names[u] for u in eligible}, groups, **kw)


def test_a_residual_chain_is_cut_at_each_blocks_add_and_split_into_the_fewest_pieces() -> None:
    graph = _residual_chain(5)
    fusion = fuse_graph(graph, [True] * graph.n)
    (group,) = _doc(graph, fusion)  # the seed's rule: the whole chain, one input op and one output op
    found = cuts(graph, [graph.names.index(n) for n in group["nodes"]])
    assert [(graph.names[v], graph.names[w]) for v, w, _ in found] == [(f"add_{k}", f"r_{k}") for k in range(5)]
    pieces = split_groups(graph, [group], 8)  # segments of 4 ops (s + block 0, then r_k + block k+1) and r_4
    assert [p["nodes"] for p in pieces] == [
        ["s", "c1_0", "c2_0", "add_0", "r_0", "c1_1", "c2_1", "add_1"],
        ["r_1", "c1_2", "c2_2", "add_2", "r_2", "c1_3", "c2_3", "add_3"],
        ["r_3", "c1_4", "c2_4", "add_4", "r_4"]]
    assert [(p["input"], p["output"]) for p in pieces] == [("s", "add_1"), ("r_1", "add_3"), ("r_3", "r_4")]
    assert all(p["split_from"] == 0 for p in pieces)
    everything = range(graph.n)
    assert _check(graph, everything, pieces, max_ops=8) == []
    assert any("could be merged" in p for p in _check(graph, everything, pieces))  # only the cap keeps them apart
    assert split_groups(graph, [group], graph.n) == [group]


def test_a_segment_larger_than_the_cap_splits_into_runs_with_one_input_op_and_one_output_op() -> None:
    """A block has no cut inside (its input feeds its first op and its add): under a cap of 2 the chain splits into
    runs of consecutive ops, each with one input op and one output op: the stem alone (it feeds two ops of the
    block), the two convolutions, the add with the ReLU after it (the add its one op reading outside it)."""
    graph = _residual_chain(3)
    (group,) = _doc(graph, fuse_graph(graph, [True] * graph.n))
    pieces = split_groups(graph, [group], 2)
    assert [p["nodes"] for p in pieces] == [["s"], ["c1_0", "c2_0"], ["add_0", "r_0"], ["c1_1", "c2_1"],
                                            ["add_1", "r_1"], ["c1_2", "c2_2"], ["add_2", "r_2"]]
    assert [(p["input"], p["output"]) for p in pieces][2] == ("add_0", "r_0")
    assert _check(graph, range(graph.n), pieces, max_ops=2) == []
    assert split_groups(graph, [group], 3) == pieces  # no run of 3 has one input op and one output op


def _fewest_runs(graph, names: list[str], cap: int) -> int:
    """The fewest runs of consecutive ``names`` (a topological order), each within ``cap`` and with one input op
    and one output op, by breadth-first search over the positions where a run may end."""
    preds = {n: set() for n in graph.names}
    succs = {n: set() for n in graph.names}
    for u, v in graph.edges():
        succs[graph.names[u]].add(graph.names[v])
        preds[graph.names[v]].add(graph.names[u])

    def one_in_one_out(run: list[str]) -> bool:
        inside = set(run)
        return (sum(1 for m in run if not preds[m] or not preds[m] <= inside) == 1
                and sum(1 for m in run if not succs[m] or not succs[m] <= inside) == 1)

    depth, frontier = {0: 0}, [0]
    while frontier:
        at = frontier.pop(0)
        for end in range(at + 1, min(at + cap, len(names)) + 1):
            if end not in depth and one_in_one_out(names[at:end]):
                depth[end] = depth[at] + 1
                frontier.append(end)
    return depth[len(names)]


def _fewest(sizes: list[int], cap: int) -> int:
    """The fewest runs of consecutive segments (``sizes``) with every run of several segments within ``cap``."""
    best = [0] + [len(sizes)] * len(sizes)
    for end in range(1, len(sizes) + 1):
        for start in range(end):
            if end - start == 1 or sum(sizes[start:end]) <= cap:
                best[end] = min(best[end], best[start] + 1)
    return best[-1]


@pytest.mark.parametrize("seed", range(4))
def test_random_groupings_split_keep_the_rule_and_are_the_fewest_pieces(seed: int) -> None:
    rng = random.Random(seed)
    split_any = over_cap = 0
    for _ in range(60):
        n = rng.randint(8, 70)
        graph = random_dag(n, rng.randrange(10**6), max_preds=rng.randint(1, 3), window=rng.randint(2, 8))
        mask = random_mask(n, rng.randrange(10**6), rng.choice([0.8, 1.0]))
        groups = _doc(graph, fuse_graph(graph, mask))
        cap = rng.randint(2, 12)
        pieces = split_groups(graph, groups, cap)
        eligible = [u for u in range(n) if mask[u]]
        assert _check(graph, eligible, pieces, max_ops=cap) == []
        assert sorted(m for p in pieces for m in p["nodes"]) == sorted(m for g in groups for m in g["nodes"])
        index = {name: u for u, name in enumerate(graph.names)}
        for group in groups:
            parts = [p for p in pieces if p.get("split_from") == group["id"]]
            if not parts:
                continue
            split_any += 1
            nodes = [index[m] for m in group["nodes"]]
            bounds = [0] + [len(a) for _, _, a in cuts(graph, nodes)] + [len(nodes)]
            sizes = [b - a for a, b in zip(bounds, bounds[1:])]
            assert all(len(part["nodes"]) <= cap for part in parts)
            if max(sizes) <= cap:  # runs of the segments between cuts
                assert len(parts) == _fewest(sizes, cap)
            else:  # a segment over the cap: runs of the group's order
                over_cap += 1
                assert len(parts) == _fewest_runs(graph, group["nodes"], cap)
    assert split_any > 0 and over_cap > 0


def test_a_fused_resnet_split_into_blocks_plans_below_its_unsplit_trunk_and_trains_as_eager(tmp_path) -> None:
    """A tiny ResNet's trunk is one group under the seed's rule, so its fused plan cannot recompute anything smaller;
    split at ``max_ops`` into its residual blocks (``fused_spec``'s ``max_ops``), the plan recomputes blocks, reaches
    a lower budget than the unsplit model and still gives the unfused model's loss and gradients."""
    spec = TINY_RESNET
    least, models = {}, {}
    for cap in (None, 16):
        built = build_model("tiny_resnet+inductor", fused_spec("tiny_resnet", spec, {"builtin": "inductor"}, seed=0,
                                                                max_ops=cap, compiler="fx"), seed=0)
        planned = trainplan.plan(built.module, built.batch, 0.1, time_limit_s=3, progress=False,
                                 cache_dir=tmp_path / str(cap), on_infeasible="raise_budget")
        least[cap], models[cap] = planned.report.planned_budget_bytes, (built, planned)
    split, whole = models[16][0].module.fusion, models[None][0].module.fusion
    assert max(f["n_ops"] for f in split["fused"]) <= 16 < max(f["n_ops"] for f in whole["fused"])
    assert split["groups_split"] == 1 and whole["groups_split"] == 0  # the trunk: stem, 3 blocks, pooling
    assert [f["n_ops"] for f in split["fused"] if "split_from" in f] == [5, 13, 13, 16, 3]
    assert least[16] < 0.85 * least[None]
    built, planned = models[16]
    computes = {}
    for kind, op in planned.step.stages[0].events:
        computes[op] = computes.get(op, 0) + (kind == "compute")
    assert any(c > 1 for o, c in computes.items() if o.endswith("_fwd"))  # a block recomputed whole
    raw = build_model("tiny_resnet", spec, seed=0)
    loss = planned(built.batch)
    loss.backward()
    want = raw.loss_fn(raw.module(**raw.batch))
    want.backward()
    torch.testing.assert_close(loss, want)
    for (name, a), b in zip(built.module.named_parameters(), raw.module.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name, rtol=1e-4, atol=1e-5)
