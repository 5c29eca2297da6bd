"""Profile: per-op timings cover every op, add up to the measured step, and transfer costs follow bandwidth."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from trainplan.models import build_model
from trainplan.profile.link import measure_host_link, sample_sizes
from trainplan.artifacts import with_measured_workspaces
from trainplan.profile.op_times import profile_model, timed_run
from trainplan.profile.workspace import op_workspaces
from tests.conftest import SMALL_CNN


def test_timed_run_computes_the_same_step(small_cnn):
    _, traced, flat, _ = small_cnn
    want = traced.gm(*[t.detach().clone() for t in flat])
    times, env = timed_run(traced.gm, [t.detach().clone() for t in flat], lambda: None, keep_values=True)
    output = next(n for n in traced.gm.graph.nodes if n.op == "output")
    got = [env[a] for a in output.args[0]]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert set(times) == {n.name for n in traced.gm.graph.nodes if n.op == "call_function"}


def test_profile_model_covers_every_op(small_cnn):
    _, _, _, tables = small_cnn
    built = build_model("small_cnn", SMALL_CNN, seed=0)
    device = {"type": "cpu", "memory_gib": 1.0, "host_link_gbytes_per_s": 2.0}
    result = profile_model(built, tables.nodes, device=device, repeats=3, warmup=1, progress=False)
    ops = result.ops
    assert ops.name.tolist() == tables.nodes.name.tolist()
    assert (ops.time_s > 0).all()
    forward_compute = ~tables.nodes.is_view & (tables.nodes.phase == "forward")
    assert ops.loc[forward_compute.to_numpy() & ~tables.nodes.op.str.contains("_\\.").to_numpy(), "recompute_s"].notna().all()
    assert ops.loc[(tables.nodes.phase == "backward").to_numpy(), "recompute_s"].isna().all()
    assert ops.transfer_s.tolist() == (tables.nodes.alloc_bytes / 2e9).tolist()
    s = result.summary
    assert len(s["step_time_runs_s"]) == 3
    assert math.isclose(s["op_sum_s"], ops.time_op_s.sum())
    assert math.isclose(ops.time_s.sum(), s["step_time_s"])  # op times in the compiled step's runtime
    assert math.isclose(s["op_sum_over_step"], s["op_sum_s"] / s["step_time_s"])
    assert s["step_time_s"] == sorted(s["step_time_runs_s"])[1]  # the median of three runs
    assert s["host_link"] == {"source": "config"} and s["host_link_bytes_per_s"] == 2e9
    assert (ops.workspace_measured_bytes >= 0).all()
    conv_backward = (tables.nodes.op == "aten.convolution_backward.default").to_numpy()
    assert conv_backward.any() and (ops.workspace_measured_bytes[conv_backward] > 0).any()


_TEMP_FLOATS = 1 << 18  # a 1 MiB temporary


def _with_temporary(x: torch.Tensor) -> torch.Tensor:
    """``x`` scaled by a sum over a 1 MiB temporary, freed before the call returns."""
    tmp = torch.ones(_TEMP_FLOATS)
    return x * tmp.sum()


def _op_graph() -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(_with_temporary, (x,))
    z = graph.call_function(torch.ops.aten.add.Tensor, (y, x))
    graph.output(graph.call_function(torch.ops.aten.relu.default, (z,)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_op_workspaces_count_what_a_call_frees_before_returning_and_not_its_output():
    gm = _op_graph()
    ws = op_workspaces(gm, [torch.randn(1000)], torch.device("cpu"))
    scaled, add, relu = (n.name for n in gm.graph.nodes if n.op == "call_function")
    temp = 4 * _TEMP_FLOATS
    assert temp <= ws[scaled] <= temp + 1024  # the temporary and its sum, not the 4000 B output
    assert ws[add] == 0 and ws[relu] == 0


def test_measured_workspaces_raise_and_never_lower_the_computed_ones():
    nodes = pd.DataFrame({"name": ["a", "b", "c"], "workspace_bytes": [0, 500, 10],
                          "workspace_measured_bytes": [300, 100, 0]})
    assert with_measured_workspaces(nodes).workspace_bytes.tolist() == [300, 500, 10]
    assert with_measured_workspaces(nodes.drop(columns="workspace_bytes")).workspace_bytes.tolist() == [300, 100, 0]


def test_measured_host_link_times_the_executors_swap_path():
    sizes = [1 << 20, 3 << 20, 5000]
    link = measure_host_link(torch.device("cpu"), sizes, repeats=3, warmup=1)
    assert (link.tensors, link.bytes_per_direction, link.repeats) == (3, sum(sizes), 3)
    assert link.sizes == tuple(sizes) and link.to_dict()["sizes"] == sizes
    assert link.swap_out_s > 0 and link.swap_in_s > 0
    assert link.bytes_per_s == pytest.approx(2 * sum(sizes) / (link.swap_out_s + link.swap_in_s))
    assert sample_sizes([0, 5, 6, 7, 8], 2, 100) == [5, 7] and sample_sizes([0, 3], 4, 100) == [3]
    assert sample_sizes([4, 5, 6], 3, 10) == [4, 5] and sample_sizes([40, 5], 3, 10) == [40]
    with pytest.raises(ValueError, match="no tensor sizes"):
        measure_host_link(torch.device("cpu"), [])
