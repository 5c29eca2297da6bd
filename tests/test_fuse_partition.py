"""The fusion partitioner on hand-made and random graphs, checked by the independent checker (fuse.check)."""

from __future__ import annotations

import json
import random

import pytest

from trainplan.cli import main
from trainplan.fuse import FuseError, build_graph, fuse_graph
from trainplan.fuse.check import check_grouping
from trainplan.fuse.merge import contract_order, merge_groups
from trainplan.fuse.synthetic import random_dag, random_mask


def _graph(edges: list[tuple[str, str]], names: str):
    return build_graph(list(names), ["op"] * len(names), edges)


def _groups(graph, fusion) -> list[set[str]]:
    return [{graph.names[u] for u in g.nodes} for g in fusion.groups]


def _check(graph, fusion, **kw) -> list[str]:
    doc = fusion.to_dict(graph)
    eligible = {graph.names[u] for u in range(graph.n) if fusion.eligible[u]}
    edges = [(graph.names[u], graph.names[v]) for u, v in graph.edges()]
    return check_grouping(graph.names, edges, eligible, doc["groups"], **kw)


def test_diamond_becomes_one_group() -> None:
    g = _graph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], "abcd")
    f = fuse_graph(g, [True] * 4)
    assert _groups(g, f) == [set("abcd")]
    assert (g.names[f.groups[0].input], g.names[f.groups[0].output]) == ("a", "d")


def test_host_node_in_a_diamond_splits_it_without_a_cycle() -> None:
    # a -> b -> d, a -> c -> d with c on the host: {a, b, d} would contract to a cycle through c, {a, b}
    # has two output ops (a feeds c, b feeds d) and {b, d} two input ops: only singletons qualify.
    g = _graph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], "abcd")
    f = fuse_graph(g, [True, True, False, True])
    assert _groups(g, f) == [{"a"}, {"b"}, {"d"}]
    assert _check(g, f) == []


def test_second_output_splits_a_chain() -> None:
    # a -> b -> c with b also read by host node h: b is an output op, so {a, b, c} has two.
    g = _graph([("a", "b"), ("b", "c"), ("b", "h")], "abch")
    f = fuse_graph(g, [True, True, True, False])
    assert _groups(g, f) == [{"a", "b"}, {"c"}]


def test_library_rule_failure_splits_its_region() -> None:
    g = _graph([("a", "b"), ("b", "c"), ("c", "d"), ("d", "e")], "abcde")
    f = fuse_graph(g, [True] * 5, {2: "rule 0: dtype int64 denied"})
    assert _groups(g, f) == [{"a", "b"}, {"d", "e"}]
    assert f.to_dict(g)["host_nodes"] == ["c"] and f.to_dict(g)["rejected"] == {"c": "rule 0: dtype int64 denied"}


def test_contraction_check_names_the_groups_of_a_cycle() -> None:
    g = _graph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], "abcd")
    with pytest.raises(FuseError, match=r"group 0.*node 'c'|node 'c'.*group 0"):
        contract_order(g, [[0, 1, 3]])


def test_merge_pass_makes_any_single_input_output_grouping_maximal() -> None:
    # From all-singleton groups (trivially one input op and one output op each), the merge pass alone
    # must reach a grouping the checker finds maximal and cycle-free.
    total = 0
    for seed in range(40):
        g = random_dag(30, seed, max_preds=1 + seed % 3, window=4)
        mask = random_mask(30, seed, 0.9)
        singles = [[u] for u in range(g.n) if mask[u]]
        groups, ends, merges = merge_groups(g, singles, [(u, u) for (u,) in singles], mask)
        assert merges == len(singles) - len(groups)
        total += merges
        doc = [{"nodes": [g.names[u] for u in grp], "input": g.names[i], "output": g.names[o]}
               for grp, (i, o) in zip(groups, ends)]
        eligible = {g.names[u] for u in range(g.n) if mask[u]}
        edges = [(g.names[u], g.names[v]) for u, v in g.edges()]
        assert check_grouping(g.names, edges, eligible, doc) == [], seed
        assert _check(g, fuse_graph(g, mask)) == []
    assert total > 0


@pytest.mark.parametrize("seed", range(6))
def test_random_dags_through_the_cli(tmp_path, seed: int) -> None:
    rng = random.Random(1000 + seed)
    for case in range(25):
        n = rng.randint(2, 60)
        g = random_dag(n, rng.randrange(10**6), max_preds=rng.randint(1, 4), window=rng.randint(2, 16))
        mask = random_mask(n, rng.randrange(10**6), rng.choice([0.3, 0.7, 0.9, 1.0]))
        edges = [[g.names[u], g.names[v]] for u, v in g.edges()]
        doc = {"nodes": [{"id": name, "op": "aten.add.Tensor", "supported": s} for name, s in zip(g.names, mask)],
               "edges": edges}
        (tmp_path / "g.json").write_text(json.dumps(doc))
        assert main(["fuse", str(tmp_path / "g.json"), "-o", str(tmp_path / "out.json")]) == 0
        out = json.loads((tmp_path / "out.json").read_text())
        eligible = {name for name, s in zip(g.names, mask) if s}
        problems = check_grouping(g.names, [tuple(e) for e in edges], eligible, out["groups"])
        assert problems == [], (seed, case, problems)
        assert out["contracted_is_dag"] is True
        assert sorted(out["host_nodes"]) == sorted(set(g.names) - eligible)
        assert sorted(m for grp in out["groups"] for m in grp["nodes"]) == sorted(eligible)


def test_checker_catches_bad_groupings() -> None:
    names, edges = list("abcd"), [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
    every = set(names)
    assert check_grouping(names, edges, every, [{"nodes": names, "input": "a", "output": "d"}]) == []
    assert any("could be merged" in p for p in check_grouping(
        list("abc"), [("a", "b"), ("b", "c")], set("abc"), [{"nodes": ["a", "b"], "input": "a", "output": "b"}]))
    assert any("output ops ['b', 'c']" in p for p in check_grouping(
        names, edges, every, [{"nodes": ["a", "b", "c"], "input": "a", "output": "b"}]))
    assert any("cycle" in p for p in check_grouping(
        names, edges, every - {"c"}, [{"nodes": ["a", "b", "d"], "input": "a", "output": "d"}]))
    assert any("not supported" in p for p in check_grouping(
        names, edges, every - {"b"}, [{"nodes": names, "input": "a", "output": "d"}]))
