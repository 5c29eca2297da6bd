"""Support tables on real graphs: Inductor's registry, the acclib rules, the fuse rule's forward grouping and the
baselines."""

from __future__ import annotations

import pytest

from trainplan.export.tables import graph_tables
from trainplan.export.trace import trace_training_step
from trainplan.fuse import inductor_table, load_table, support_masks
from trainplan.fuse.baselines import fx_capability_groups, ort_wave_groups
from trainplan.fuse.check import check_grouping
from trainplan.fuse.exported import OUTPUT, graph_from_export
from trainplan.fuse.graph import TensorInfo
from trainplan.fuse.forward import trace_forward
from trainplan.fuse.merge import contract_order
from trainplan.fuse.stage import fuse_forward
from trainplan.fuse.support import conv_groups
from trainplan.fuse.synthetic import random_dag, random_mask
from trainplan.models import build_model

ACCLIB = "config/targets/acclib.yaml"


@pytest.fixture(scope="module")
def cnn():
    built = build_model("small_cnn", {"source": "callable", "callable": "trainplan.zoo:small_cnn"}, seed=0)
    traced, _ = trace_training_step(built)
    return built, graph_tables(traced)


@pytest.fixture(scope="module")
def cnn_tables(cnn):
    return cnn[1]


@pytest.fixture(scope="module")
def inductor():
    return inductor_table()


def test_inductor_table_comes_from_torchs_registry(inductor) -> None:
    import torch._inductor.lowering as lowering

    assert inductor.runs("aten.mm.default") and inductor.runs("aten.relu.default")
    assert inductor.runs("aten.native_layer_norm.default")  # decomposed, not lowered
    fallback = {str(op) for op in lowering.fallbacks}
    assert "aten.convolution_backward.default" in fallback and not inductor.runs("aten.convolution_backward.default")
    assert not inductor.runs("aten._scaled_dot_product_flash_attention_for_cpu.default")
    assert inductor.source["supported"] == len(inductor.ops) - 1 > 500


def test_acclib_rules_on_shapes() -> None:
    table = load_table(ACCLIB)
    f32 = "float32"
    grouped = [TensorInfo((2, 32, 8, 8), f32), TensorInfo((32, 1, 3, 3), f32)]  # depthwise: 32 groups
    plain = [TensorInfo((2, 32, 8, 8), f32), TensorInfo((64, 32, 3, 3), f32)]
    assert conv_groups(grouped) == 32 and conv_groups(plain) == 1
    assert "groups 32 != 1" in table.violation("aten.convolution.default", grouped, [])
    assert table.violation("aten.convolution.default", plain, []) is None
    assert "max_dim" in table.violation("aten.mm.default", [TensorInfo((8, 50257), f32)], [])
    assert "int64" in table.violation("aten.add.Tensor", [TensorInfo((8,), "int64")], [])
    assert not table.runs("aten.embedding.default") and not table.runs("aten.index.Tensor")


@pytest.mark.parametrize("target", ["inductor", "acclib"])
def test_groups_of_a_real_forward_graph_pass_the_independent_check(cnn, inductor, target) -> None:
    """The fuse rule's work: the forward graph grouped, its ops timed and placed in modules by the exported step."""
    built, tables = cnn
    table = inductor if target == "inductor" else load_table(ACCLIB)
    ops = tables.nodes[["name"]].assign(time_s=1e-3)
    result = fuse_forward(trace_forward(built), table, tables.nodes, ops, fx_max_nodes=10_000)
    graph = result.graph
    assert result.document["graph"]["grouped"] == "forward"
    assert result.document["graph"]["ops_in_exported_step"] == result.document["graph"]["ops"] == graph.n - 1
    assert result.groups["time_s"].sum() == pytest.approx(1e-3 * result.groups["n_ops"].sum())  # profiled times
    assert (result.groups["phase"] == "forward").all() and (result.groups["module"] != "").any()
    eligible = {graph.names[u] for u in range(graph.n) if result.fusion.eligible[u]}
    edges = [(graph.names[u], graph.names[v]) for u, v in graph.edges()]
    assert check_grouping(graph.names, edges, eligible, result.document["groups"]) == []
    assert OUTPUT in result.document["host_nodes"]
    compare = result.compare.set_index("method")
    ours = compare.iloc[0]
    # the baselines allow several input and output ops: they cover at least as much on the same mask
    assert (compare["coverage_ops"] >= ours["coverage_ops"]).all() and len(compare) == 3
    assert result.groups["n_ops"].sum() == len(eligible)
    if target == "acclib":
        assert any("int64" in why for why in result.document["rejected"].values())


def test_baselines_are_cycle_free_and_cover_the_mask() -> None:
    for seed in range(5):
        g = random_dag(80, seed, window=6)
        mask = random_mask(80, seed, 0.8)
        for method in (ort_wave_groups, fx_capability_groups):
            groups = method(g, mask)
            contract_order(g, groups)
            assert sorted(u for grp in groups for u in grp) == [u for u in range(80) if mask[u]]


def test_getitem_follows_its_producer(cnn_tables) -> None:
    graph = graph_from_export(cnn_tables.nodes, cnn_tables.tensors)
    supported, _ = support_masks(graph, load_table(ACCLIB))
    for u in range(graph.n):
        if graph.ops[u] == "getitem":
            assert supported[u] == supported[graph.preds[u][0]]


def test_output_check_reports_and_enforces_the_tolerance() -> None:
    import torch

    from trainplan.fuse import FuseError
    from trainplan.fuse.measure import compare_outputs

    near = compare_outputs((torch.tensor([1.0, 2.0]), torch.zeros(3)), (torch.tensor([1.0, 2.00001]), torch.zeros(3)),
                           1e-4, 1e-5)
    assert near["within_tolerance"] and near["max_tolerance_ratio"] < 1
    far = compare_outputs((torch.ones(2),), (torch.zeros(2),), 1e-4, 1e-5, strict=False)
    assert not far["within_tolerance"] and far["max_abs_diff"] == 1.0
    with pytest.raises(FuseError, match="output 0 differs"):
        compare_outputs((torch.ones(2),), (torch.zeros(2),), 1e-4, 1e-5)


def test_the_table_without_matmuls_keeps_everything_else_inductor_runs():
    """The frontier's fused methods group around the matrix products: the table runs none of them and every other
    op of Inductor's table (pointwise, reductions, getitem)."""
    from trainplan.fuse.support import MATMULS, resolve_table

    full = inductor_table()
    table = resolve_table({"builtin": "inductor-no-matmul"})
    assert table.name == "inductor-no-matmul" and table.source["without"] == list(MATMULS)
    assert not any(table.runs(f"aten.{m}.default") for m in ("mm", "addmm", "bmm", "baddbmm"))
    assert all(table.runs(op) for op in ("aten.gelu.default", "aten.native_layer_norm.default", "aten.sum.dim_IntList",
                                         "getitem"))
    assert set(full.ops) - set(table.ops) == {op for op in full.ops if "." in op and op.split(".")[1] in MATMULS}
