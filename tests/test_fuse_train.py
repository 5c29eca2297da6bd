"""The training step with fused ops: the seed's rule on the forward graph gives larger groups than on the
traced step, every grouping passes the independent checker, the fused step is run and checked against an
exact step, and the check fails a step whose gradients are wrong."""

from __future__ import annotations

import numpy as np
import torch

from trainplan.fuse import fuse_graph, inductor_table, load_table, support_masks
from trainplan.fuse.coverage import coverage
from trainplan.fuse.exported import graph_from_export
from trainplan.fuse.forward import op_graph, trace_forward
from trainplan.fuse.train_step import check_against_exact, measure_train_step, partition_forward


def test_forward_groups_are_larger_than_on_the_traced_step(small_cnn) -> None:
    built, _, _, tables = small_cnn
    fg = trace_forward(built)
    graph = op_graph(fg.gm)
    dead = [n.name for n in fg.gm.graph.nodes if n.op == "call_function" and not n.users and not n.is_impure()]
    assert "<output>" in graph.names and dead == []
    groups, stats = partition_forward(fg, inductor_table())  # raises if the independent checker finds a violation
    assert stats["ops"] == len(graph.names) - 1
    assert sorted(m for g in groups for m in g["nodes"]) == sorted(n for n in graph.names if n != "<output>")
    joint_graph = graph_from_export(tables.nodes, tables.tensors)  # the traced step: forward and backward
    joint = fuse_graph(joint_graph, *support_masks(joint_graph, inductor_table()))
    joint_groups = [list(g.nodes) for g in joint.groups]
    assert stats["largest"] > max(len(g) for g in joint_groups)
    assert stats["coverage_ops"] > coverage(joint_groups, joint.eligible, np.zeros(joint_graph.n))["coverage_ops"]
    for baseline in stats["baselines"].values():  # multi-input/multi-output grouping covers at least as much
        assert baseline["coverage_ops"] >= stats["coverage_ops"] and baseline["largest"] >= stats["largest"]


def test_the_fused_step_runs_and_matches_the_exact_step(tiny_gpt2) -> None:
    """tiny GPT-2 on the accelerator table: host ops (embedding, attention) split the forward; groups that end
    in a multi-output op (split) compile too."""
    built = tiny_gpt2[0]
    groups, summary = measure_train_step(built, load_table("config/targets/acclib.yaml"), min_ops=2, max_groups=6,
                                         rounds=3, warmup=1, whole_step=True, rtol=1e-4, atol=1e-6, seed=0)
    assert summary["forward_graph"]["host_ops"] > 0 and summary["groups_failed"] == []
    assert len(groups) == min(6, summary["groups_eligible"]) == summary["groups_compiled"]
    assert (groups["n_ops"] >= 2).all() and (groups["kernels_fused"] >= 1).all()
    assert (groups["kernels_eager"] > groups["kernels_fused"]).any()
    assert ((groups["ci95_low"] <= groups["speedup"]) & (groups["speedup"] <= groups["ci95_high"])).all()
    assert summary["check_float64"]["within_tolerance"] and summary["check_float64"]["worst_ratio"] < 1e-3
    for name in ("eager", "fused", "selected", "whole"):
        assert summary["check"][name]["within_tolerance"], summary["check"][name]
        assert len(summary["samples_s"][name]) == 3
    assert summary["fused_vs_eager"]["speedup"] > 0 and summary["kept_of_whole_gain"].keys() == {"fused", "selected"}
    assert set(summary["groups_selected"]) == set(groups.loc[groups["faster"], "group"])


def test_the_check_fails_a_step_with_wrong_gradients(small_cnn) -> None:
    built = small_cnn[0]
    fg = trace_forward(built)

    def scaled(*inputs: torch.Tensor) -> torch.Tensor:  # the right loss value, gradients 1% too large
        loss = fg.gm(*inputs)
        return loss + 0.01 * (loss - loss.detach())

    result = check_against_exact(built, fg, {"eager": fg.gm, "scaled": scaled}, rtol=1e-4, atol=1e-6)
    assert result["eager"]["within_tolerance"] and result["eager"]["worst_ratio"] <= 1 / 3 + 1e-9
    assert not result["scaled"]["within_tolerance"] and result["scaled"]["worst_at"] != "loss"


def test_the_float64_check_fails_a_wrong_fused_kernel(small_cnn, monkeypatch) -> None:
    from trainplan.fuse import train_step

    built = small_cnn[0]
    fg = trace_forward(built)
    groups = [g for g in partition_forward(fg, inductor_table())[0] if len(g["nodes"]) >= 2]
    right = train_step.check_float64(built, fg, groups, rtol=1e-4, atol=1e-6, log=print)
    assert right["within_tolerance"] and right["groups"] == len(groups) > 0 and right["worst_ratio"] < 1e-3
    real = train_step._compile

    def off_by_a_percent(sub, args):  # a fused kernel whose result is 1% too large
        fn, seconds, launches = real(sub, args)

        def wrong(*a):
            out = fn(*a)
            return [t * 1.01 for t in out] if isinstance(out, (list, tuple)) else out * 1.01

        return wrong, seconds, launches

    monkeypatch.setattr(train_step, "_compile", off_by_a_percent)
    wrong = train_step.check_float64(built, fg, groups, rtol=1e-4, atol=1e-6, log=print)
    assert not wrong["within_tolerance"] and wrong["worst_ratio"] > 10
