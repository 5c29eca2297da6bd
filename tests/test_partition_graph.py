"""Pipeline view of a graph: key rules, validation errors, range tables against direct per-stage sums.

Also home of ``training_graph``, the synthetic graph builder the other partition tests import.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pandas as pd
import pytest

from trainplan.partition import PartitionError, pipeline_graph, range_tables, stage_stats

NODE_COLS = ["node_id", "name", "op", "module", "phase", "inputs", "outputs", "input_nodes", "alloc_bytes",
             "is_view", "flops", "time_s"]


class GraphBuilder:
    """Nodes and tensors tables in the format of docs/artifacts.md, one output tensor per op."""

    def __init__(self) -> None:
        self.nodes: list[dict] = []
        self.tensors: list[dict] = []
        self.kind: dict[str, str] = {}

    def placeholder(self, name: str, nbytes: int, kind: str = "parameter") -> str:
        self._tensor(name, name, nbytes, kind)
        return name

    def op(self, name: str, phase: str, inputs: list[str], nbytes: int, time_s: float, *,
           view_of: str | None = None) -> str:
        self.nodes.append({"node_id": len(self.nodes), "name": name, "op": "aten.view.default" if view_of else
                           "aten.mul.Tensor", "module": "m", "phase": phase, "inputs": inputs, "outputs": [name],
                           "input_nodes": inputs, "alloc_bytes": 0 if view_of else nbytes,
                           "is_view": bool(view_of), "flops": 1.0, "time_s": time_s})
        kind = "activation" if phase == "forward" else "gradient"
        self._tensor(name, name, nbytes, kind, storage_of=view_of)
        return name

    def _tensor(self, tid: str, node: str, nbytes: int, kind: str, storage_of: str | None = None) -> None:
        storage = next(t["storage"] for t in self.tensors if t["tensor_id"] == storage_of) if storage_of \
            else len(self.tensors)
        self.tensors.append({"tensor_id": tid, "node": node, "shape": [nbytes // 4], "dtype": "float32",
                             "numel": nbytes // 4, "bytes": nbytes, "storage": storage,
                             "storage_bytes": nbytes if not storage_of else
                             next(t["storage_bytes"] for t in self.tensors if t["tensor_id"] == storage_of),
                             "kind": kind, "is_graph_output": False})

    def output(self, *names: str) -> None:
        for t in self.tensors:
            if t["tensor_id"] in names:
                t["is_graph_output"] = True

    def tables(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        return pd.DataFrame(self.nodes, columns=NODE_COLS), pd.DataFrame(self.tensors)


def training_graph(n: int, seed: int, *, skip_prob: float = 0.3) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Forward chain f1..fn (random times/bytes, skips f_{i-s} -> f_i), loss, mirrored backward.

    Backward: the loss seed (no inputs) and the loss's backward ``dloss``; g_i reads g_{i+1} (or dloss)
    and the activations f_i, f_{i-1} (and its skip input); w_i (weight gradient) reads g_{i+1} and
    f_{i-1}; every second layer's weight gradient is followed by a gradient-only accumulation ``acc_i``
    (rule 3).
    """
    rng = random.Random(seed)
    b = GraphBuilder()
    x = b.placeholder("x", 4096, "input")
    fwd = [x]
    skips: dict[int, int] = {}
    for i in range(1, n + 1):
        w = b.placeholder(f"p{i}", 64 * rng.randint(1, 8))
        ins = [fwd[-1], w]
        if i > 3 and rng.random() < skip_prob:
            skips[i] = i - rng.randint(2, 3)
            ins.append(fwd[skips[i]])
        fwd.append(b.op(f"f{i}", "forward", ins, 1024 * rng.randint(1, 16), rng.uniform(1e-3, 5e-3)))
    loss = b.op("loss", "forward", [fwd[-1]], 4, 1e-4)
    seed = b.op("seed", "backward", [], 4, 1e-5)  # ones_like(loss): no inputs (rule 4)
    grad = b.op("dloss", "backward", [seed, fwd[-1]], 1024, 1e-4)  # the loss's backward
    for i in range(n, 0, -1):
        ins = [grad, fwd[i], fwd[i - 1]] + ([fwd[skips[i]]] if i in skips else [])
        wg = b.op(f"w{i}", "backward", [grad, fwd[i - 1]], 64, rng.uniform(1e-3, 5e-3))
        if i % 2 == 0:
            b.op(f"acc{i}", "backward", [wg, grad], 64, 1e-4)
        grad = b.op(f"g{i}", "backward", ins, 1024 * rng.randint(1, 16), rng.uniform(1e-3, 8e-3))
    b.output(loss)
    return b.tables()


def random_cuts(n: int, k: int, rng: random.Random) -> tuple[int, ...]:
    return (0, *sorted(rng.sample(range(1, n), k - 1)), n)


def test_keys_follow_the_documented_rules():
    nodes, tensors = training_graph(6, seed=1, skip_prob=0.0)
    g = pipeline_graph(nodes, tensors)
    key = dict(zip(g.names, g.key))
    assert [key[f"f{i}"] for i in range(1, 7)] == list(range(6)) and key["loss"] == 6  # rule 1
    # rule 2: g4 reads f4 (made at 3) and f3 (made at 2, read at 3), its gradient comes from g5 (4): 3
    assert key["g4"] == 3
    # rule 2: w4 reads only f3: its producer is at 2, but its reader f4 (3) also holds it and 3 < 4
    assert key["w4"] == 3
    assert key["acc4"] == 3  # rule 3: producers w4 (3) and g5 (4): the smallest
    # dloss reads the seed, which has no position yet (rule 4): its gradient counts as from the end
    assert key["dloss"] == 6 and key["g6"] == 5 and key["w6"] == 5
    assert key["seed"] == 6  # rule 4: no inputs; its consumer dloss sits at 6
    assert key["w1"] == 1  # reads the batch (fixed) and g2: rule 3


def test_sourceless_backward_op_without_consumers_goes_last():
    nodes, tensors = training_graph(3, seed=0, skip_prob=0.0)
    b = GraphBuilder()
    b.nodes, b.tensors = nodes.to_dict("records"), tensors.to_dict("records")
    b.op("zeros", "backward", [], 64, 1e-5)
    g = pipeline_graph(*b.tables())
    assert g.key[g.names.index("zeros")] == g.n_forward - 1


def test_topological_order_repairs_a_shuffled_table():
    nodes, tensors = training_graph(8, seed=2)
    shuffled = nodes.sample(frac=1.0, random_state=0).reset_index(drop=True)
    g, h = pipeline_graph(shuffled, tensors), pipeline_graph(nodes, tensors)
    assert dict(zip(g.names, g.key)) == dict(zip(h.names, h.key))
    position = {name: i for i, name in enumerate(g.names)}
    for row in shuffled.itertuples():
        assert all(position[t] < position[row.name] for t in row.inputs if t in position)


@pytest.mark.parametrize("seed", range(4))
def test_range_tables_equal_direct_stage_sums(seed):
    nodes, tensors = training_graph(14, seed=seed)
    g = pipeline_graph(nodes, tensors)
    t = range_tables(g)
    rng = random.Random(seed)
    for k in (1, 2, 3, 5):
        cuts = random_cuts(g.n_forward, k, rng)
        stats = stage_stats(g, cuts)
        assert sum(s.boundary_in_bytes for s in stats) == sum(s.boundary_out_bytes for s in stats)
        for s, (a, b) in zip(stats, itertools.pairwise(cuts)):
            assert s.boundary_in_bytes == t.boundary[a, b]
            assert s.activation_bytes == t.stash[a, b]
            assert s.fixed_bytes == t.fixed[a, b]
        assert sorted(n for s in stats for n in s.nodes) == sorted(nodes.name)
        assert abs(sum(s.time_s for s in stats) - nodes.time_s.sum()) < 1e-12


def test_boundary_bytes_count_what_crosses():
    """Two-stage split of a 2-layer chain: the hand-counted tensors crossing the cut."""
    nodes, tensors = training_graph(2, seed=3, skip_prob=0.0)
    g = pipeline_graph(nodes, tensors)
    size = dict(zip(tensors.tensor_id, tensors.storage_bytes))
    s0, s1 = stage_stats(g, (0, 1, 3))
    assert s0.nodes == ["f1", "g1"]
    assert set(s1.nodes) == {"f2", "loss", "seed", "dloss", "w2", "acc2", "g2", "w1"}
    assert s1.boundary_in_bytes == size["f1"]  # f2, g2 and w2 read f1 from stage 0
    assert s0.boundary_in_bytes == size["g2"]  # g1 reads g2 from stage 1
    assert s1.boundary_out_bytes == size["g2"] and s0.boundary_out_bytes == size["f1"]
    assert s0.activation_bytes == size["f1"]  # g1 reads f1 and the batch x (fixed)
    assert s1.activation_bytes == size["f2"] + size["f1"]  # g2 reads both; the received f1 is stashed


def bad_graph(edit) -> tuple[pd.DataFrame, pd.DataFrame]:
    nodes, tensors = training_graph(4, seed=0, skip_prob=0.0)
    edit(nodes, tensors)
    return nodes, tensors


@pytest.mark.parametrize("edit, message", [
    (lambda n, t: n.at[2, "inputs"].append("ghost"), "node 'f3' refers to unknown tensor 'ghost' (dangling edge)"),
    (lambda n, t: t.__setitem__("node", t.node.where(t.tensor_id != "f1", "nowhere")),
     "reads tensor 'f1' of unknown node 'nowhere' (dangling edge)"),
    (lambda n, t: n.at[0, "inputs"].append("f3"), "graph has a cycle through node(s) 'f1' -> 'f2' -> 'f3' -> 'f1'"),
    (lambda n, t: n.at[1, "inputs"].append("g4"), "forward node 'f2' reads the backward result of 'g4'"),
    (lambda n, t: n.__setitem__("phase", n.phase.replace("backward", "optimizer")), "has phase 'optimizer'"),
    (lambda n, t: n.__setitem__("phase", "backward"), "graph has no forward ops"),
])
def test_bad_graphs_raise_naming_the_node(edit, message):
    with pytest.raises(PartitionError) as err:
        pipeline_graph(*bad_graph(edit))
    assert message in str(err.value)


def test_missing_column_is_named():
    nodes, tensors = training_graph(3, seed=0)
    with pytest.raises(PartitionError, match=r"nodes table lacks column\(s\) \['time_s'\]"):
        pipeline_graph(nodes.drop(columns="time_s"), tensors)


def test_stash_is_zero_without_backward():
    nodes, tensors = training_graph(5, seed=0)
    fwd = nodes[nodes.phase == "forward"].reset_index(drop=True)
    g = pipeline_graph(fwd, tensors[tensors.node.isin(set(fwd.name)) | ~tensors.kind.isin(["activation", "gradient"])])
    assert not np.any(range_tables(g).stash)
