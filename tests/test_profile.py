"""Profile: per-op timings cover every op, add up to the measured step, and transfer costs follow bandwidth."""

from __future__ import annotations

import math

import torch

from trainplan.models import build_model
from trainplan.profile import profile_model, timed_run
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
    assert math.isclose(s["op_sum_s"], ops.time_s.sum())
    assert math.isclose(s["op_sum_over_step"], s["op_sum_s"] / s["step_time_s"])
    assert s["step_time_s"] == sorted(s["step_time_runs_s"])[1]  # the median of three runs
