"""The partition methods a pipeline is compared with (trainplan.partition.methods): DeepSpeed's uniform and
parameters rules as its own tests state them, the layers read from real models' module paths (tiny GPT-2's blocks,
a tiny ResNet's bottlenecks), and each method's cuts at layer boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import TINY_RESNET
from trainplan.export.tables import graph_tables
from trainplan.export.trace import trace_training_step
from trainplan.models import build_model
from trainplan.partition import PartitionError, min_max_cuts, partition_graph, pipeline_graph, range_tables
from trainplan.partition.layers import model_layers
from trainplan.partition.methods import METHODS, balanced_parts, even_blocks, method_cuts, uniform_parts



@pytest.mark.parametrize(("items", "parts", "expected"), [(4, 2, [0, 2, 4]), (5, 2, [0, 3, 5]), (7, 3, [0, 3, 5, 7]),
                                                          (3, 3, [0, 1, 2, 3])])
def test_uniform_gives_the_first_parts_one_more_layer(items, parts, expected):
    assert uniform_parts(items, parts) == expected


@pytest.mark.parametrize(("weights", "parts", "allowed"), [
    ([1, 1, 1, 1], 4, [[0, 1, 2, 3, 4]]),
    ([1, 1, 1, 1, 1], 4, [[0, 1, 2, 3, 5], [0, 2, 3, 4, 5]]),  # deepspeed tests/unit/utils/test_partition_balanced
    ([5, 1, 1, 1, 1, 1], 2, [[0, 1, 6]]),
    ([1, 2, 3, 4], 2, [[0, 3, 4]]),  # 6 | 4 beats 3 | 7
])
def test_parameters_balances_the_part_sums(weights, parts, allowed):
    assert balanced_parts(weights, parts) in allowed


def test_too_few_layers_for_the_stages_is_refused():
    with pytest.raises(PartitionError, match="3 layers cannot fill 4 stages"):
        balanced_parts([1, 1, 1], 4)


def _layers(tables, name):
    nodes = tables.nodes.assign(time_s=1e-6 + tables.nodes["flops"] * 1e-12)
    graph = pipeline_graph(nodes, tables.tensors)
    return graph, range_tables(graph), model_layers(graph, nodes, tables.tensors, name)


def test_gpt2s_layers_are_its_blocks_between_embedding_and_head(tiny_gpt2):
    built, _, _, tables = tiny_gpt2
    graph, tables_, layers = _layers(tables, "tiny_gpt2")
    assert layers.names == ("pre", "transformer.h.0", "transformer.h.1", "post")
    assert layers.starts[0] == 0 and list(layers.starts) == sorted(layers.starts)
    size = {n: p.numel() for n, p in built.module.named_parameters()}
    block = sum(v for n, v in size.items() if n.startswith("transformer.h.0."))
    assert layers.parameters[1] == layers.parameters[2] == block
    wte = size["transformer.wte.weight"]
    assert layers.parameters[0] == wte + size["transformer.wpe.weight"]  # the embeddings
    assert layers.parameters[3] == wte + size["transformer.ln_f.weight"] + size["transformer.ln_f.bias"]  # tied head
    assert even_blocks(layers, 2) == [0, 2, 4]
    for method in METHODS:
        cuts = method_cuts(method, 2, graph=graph, tables=tables_, layers=layers)
        assert cuts[0] == 0 and cuts[-1] == graph.n_forward and len(cuts) == 3
        if method != "exact_dp":
            assert cuts[1] in layers.starts  # at a layer boundary
    with pytest.raises(PartitionError, match="partition method 'even_blocks', k=3: 2 layers cannot fill 3 stages"):
        method_cuts("even_blocks", 3, graph=graph, tables=tables_, layers=layers)


def test_a_resnets_blocks_are_its_bottlenecks():
    built = build_model("tiny_resnet", TINY_RESNET, seed=0)
    traced, _ = trace_training_step(built)
    _, _, layers = _layers(graph_tables(traced), "tiny_resnet")
    stages = "resnet.encoder.stages"
    assert layers.names == ("pre", f"{stages}.0.layers.0", f"{stages}.0.layers.1", f"{stages}.1.layers.0", "post")
    assert all(p > 0 for p in layers.parameters)


def test_no_partition_cuts_between_an_op_and_its_views(tiny_gpt2):
    """A cut never falls right before a forward view or getitem of a non-fixed storage (the attention kernel, its
    outputs' getitems and their views stay in one stage), even where the profile's optimum would put it there."""
    _, _, _, tables = tiny_gpt2
    graph, ranges, layers = _layers(tables, "tiny_gpt2")
    nodes = tables.nodes.set_index("name")
    fixed = set(tables.tensors.tensor_id[tables.tensors.kind.isin(["parameter", "buffer", "input", "constant"])])
    forward = [graph.names[i] for i in np.flatnonzero(graph.forward)]
    dependent = [nodes.is_view[name] and any(t not in fixed for t in nodes.inputs[name]) for name in forward]
    assert np.array_equal(~graph.cut_ok[1:-1], np.array(dependent[1:]))
    attention = next(p for p, name in enumerate(forward) if "scaled_dot_product" in name)
    after = next(p for p in range(attention + 1, graph.n_forward) if not dependent[p])
    assert after > attention + 3  # two getitems, a detach and views follow the kernel
    weights = np.zeros(graph.n_forward)
    weights[[attention, after]] = 1.0  # any cut in (attention, after] balances: the earliest is its first getitem
    assert min_max_cuts(weights, 2) == (0, attention + 1, graph.n_forward)
    assert min_max_cuts(weights, 2, allowed=graph.cut_ok) == (0, after, graph.n_forward)
    for method in METHODS:  # two blocks: two stages at most at layer boundaries
        assert graph.cut_ok[list(method_cuts(method, 2, graph=graph, tables=ranges, layers=layers))].all()
    for k in (2, 3, 4, 6):
        assert graph.cut_ok[list(partition_graph(graph, ranges, k, tolerance=0.5).cuts)].all()
