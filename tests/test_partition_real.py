"""Partitions of real traced graphs: the tiny GPT-2/CNN fixtures always, the study's artifacts when present."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainplan.artifacts import read_profiled_graph
from trainplan.partition import partition_graph, pipeline_graph, range_tables
from trainplan.partition.stages import stage_index
from trainplan.schedule.stage_problem import stage_problem

RESULTS = Path(__file__).resolve().parents[1] / "results"


def with_times(tables):
    """Nodes with a stand-in profile: time proportional to FLOPs (views cost a little)."""
    nodes = tables.nodes.copy()
    nodes["time_s"] = 1e-6 + nodes["flops"] * 1e-12
    return nodes, tables.tensors


def partition(nodes, tensors, k: int):
    g = pipeline_graph(nodes, tensors)
    part = partition_graph(g, range_tables(g), k, tolerance=0.02)
    assert sorted(n for s in part.stages for n in s.nodes) == sorted(nodes.name)
    return g, part


def check_gradient_flow(nodes, tensors, k: int) -> None:
    """Gradients only flow from later stages to earlier ones."""
    g, part = partition(nodes, tensors, k)
    stage = dict(zip(g.names, stage_index(part.cuts, g.key)))
    producer = dict(zip(tensors.tensor_id, tensors.node))
    backward = set(nodes.name[nodes.phase == "backward"])
    for row in nodes[nodes.phase == "backward"].itertuples():
        for t in row.inputs:
            if producer[t] in backward:
                assert stage[producer[t]] >= stage[row.name], (producer[t], row.name)


def check_boundary_inputs(nodes, tensors, k: int) -> None:
    """The stage problems' boundary inputs are exactly the bytes the partition says each stage receives."""
    _, part = partition(nodes, tensors, k)
    for s in part.stages:
        problem = stage_problem(nodes, tensors, s.nodes, bandwidth=1e10)
        received = sum(op["bytes"] for op in problem["ops"] if op.get("boundary"))
        assert received == s.boundary_in_bytes, s.index


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "small_cnn"])
@pytest.mark.parametrize("k", [2, 3])
def test_tiny_models_gradient_flow(fixture, k, request):
    check_gradient_flow(*with_times(request.getfixturevalue(fixture)[3]), k)


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "small_cnn"])
@pytest.mark.parametrize("k", [2, 3])
def test_tiny_models_boundary_inputs(fixture, k, request):
    check_boundary_inputs(*with_times(request.getfixturevalue(fixture)[3]), k)


def study_graph(model: str):
    paths = [RESULTS / f"export/{model}/{f}" for f in ("nodes.parquet", "tensors.parquet", "graph.json")]
    paths.append(RESULTS / f"profile/{model}/cpu/ops.parquet")
    if not all(p.exists() for p in paths):
        pytest.skip(f"no exported and profiled {model} under results/")
    return read_profiled_graph(*paths)


@pytest.mark.parametrize("model", ["gpt2", "resnet50"])
def test_study_artifacts(model):
    graph = study_graph(model)
    check_gradient_flow(graph.nodes, graph.tensors, 8)
    check_boundary_inputs(graph.nodes, graph.tensors, 8)
    g = pipeline_graph(graph.nodes, graph.tensors)
    assert np.isclose(g.time.sum(), graph.nodes.time_s.sum())
