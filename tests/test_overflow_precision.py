"""Per-op precision control: policy lists, their resolution over the graph, the precision interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from overflow_cases import GPT2_EAGER, T5_TINY, op_nodes, traced_case

from trainplan.export.tables import graph_tables
from trainplan.precision.assign import FP16, FP32, assign_precision, fp32_dtypes
from trainplan.precision.cost import fp16_shares, measure_steps, precision_table
from trainplan.precision.interpreter import InjectionError, parse_injections, run_step
from trainplan.precision.lists import autocast_policy, default_policy
from trainplan.precision.policy import PolicyError, load_policy, policy_from_dict

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpt2():
    return traced_case("gpt2_eager", GPT2_EAGER)


@pytest.fixture(scope="module")
def t5():
    return traced_case("t5_tiny", T5_TINY)


@pytest.mark.parametrize("case", ["gpt2", "t5"])
def test_all_fp32_interpreter_equals_graph(case, request):
    traced, flat = request.getfixturevalue(case)
    expected = traced.gm(*flat)
    got = run_step(traced.gm, flat, fp32_dtypes(traced.gm))
    assert len(got) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_fp16_step_runs_ops_in_their_dtype(gpt2):
    traced, flat = gpt2
    assignment = assign_precision(traced.gm, default_policy(), traced.loss_node)
    seen: dict[str, torch.dtype] = {}

    def observe(node, value):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            seen[node.name] = value.dtype

    loss, *grads = run_step(traced.gm, flat, assignment.dtype, observer=observe)
    mm = op_nodes(traced, "aten.mm.default", phase="backward")[0]
    softmax = op_nodes(traced, "aten._softmax.default")[0]
    assert seen[mm] == FP16 and seen[softmax] == FP32
    assert torch.isfinite(loss) and abs(float(loss) - float(traced.gm(*flat)[0].detach())) < 0.05
    assert any(g.dtype == FP16 for g in grads)


def test_default_policy_lists_and_infer(gpt2):
    traced, _ = gpt2
    a = assign_precision(traced.gm, default_policy(), traced.loss_node)
    nodes = {n.name: n for n in traced.gm.graph.nodes}
    for name, src in a.source.items():
        op = str(nodes[name].target)
        if op.startswith(("aten.mm.", "aten.addmm.", "aten.bmm.")):
            assert (src, a.dtype[name]) == ("allow", FP16)
        if op.startswith(("aten._softmax.", "aten.native_layer_norm.")):
            assert (src, a.dtype[name]) == ("deny", FP32)
    # tanh-GELU's pow follows its producer (the fp16 c_fc addmm); the op after a layer norm follows fp32.
    pow_fwd = op_nodes(traced, "aten.pow.Tensor_Scalar", phase="forward")[0]
    assert a.source[pow_fwd] == "infer" and a.dtype[pow_fwd] == FP16


def test_node_override_beats_op_list(gpt2):
    traced, _ = gpt2
    mm = op_nodes(traced, "aten.addmm.default")[0]
    policy = default_policy().with_denied_nodes([mm])
    a = assign_precision(traced.gm, policy, traced.loss_node)
    assert a.dtype[mm] == FP32
    assert sum(d == FP16 for n, d in a.dtype.items() if n.startswith("addmm")) == len(op_nodes(traced, "aten.addmm.default")) - 1


def test_config_default_policy_file_is_the_builtin():
    assert load_policy(REPO / "config" / "precision_policy.yaml") == default_policy()


def test_autocast_lists_and_flop_share(gpt2, t5):
    for traced, _ in (gpt2, t5):
        flops = dict(zip(*graph_tables(traced).nodes[["name", "flops"]].to_numpy().T))
        ours = fp16_shares(precision_table(traced.gm, assign_precision(traced.gm, default_policy(), traced.loss_node), flops))
        ac_assign = assign_precision(traced.gm, autocast_policy(), traced.loss_node)
        ac = fp16_shares(precision_table(traced.gm, ac_assign, flops))
        assert 0.5 < ac["fp16_flop_share"] <= ours["fp16_flop_share"] <= 1.0
        assert ac["fp16_op_fraction"] <= ours["fp16_op_fraction"]
    traced, _ = gpt2
    ac_assign = assign_precision(traced.gm, autocast_policy(), traced.loss_node)
    pow_fwd = op_nodes(traced, "aten.pow.Tensor_Scalar", phase="forward")[0]
    assert ac_assign.dtype[pow_fwd] == FP32  # pow is on autocast's fp32 list


def test_bad_policy_and_injection_are_clear_errors(gpt2):
    with pytest.raises(PolicyError, match="unknown key"):
        policy_from_dict({"allow": [], "denny": []})
    with pytest.raises(PolicyError, match="both the allow and the deny"):
        policy_from_dict({"allow": ["aten.mm"], "deny": ["aten.mm"]})
    traced, _ = gpt2
    with pytest.raises(InjectionError, match="no_such_node"):
        parse_injections([{"node": "no_such_node", "scale": 10.0}], traced.gm, "gpt2_eager")


def test_measured_activation_bytes_shrink_in_fp16(gpt2):
    traced, flat = gpt2
    default = assign_precision(traced.gm, default_policy(), traced.loss_node).dtype
    costs = measure_steps(traced.gm, flat, {"fp32": fp32_dtypes(traced.gm), "default": default}, traced.loss_node, repeats=1, warmup=0)
    fp32, half = costs["fp32"], costs["default"]
    assert 0 < half.saved_for_backward_bytes < fp32.saved_for_backward_bytes <= fp32.activation_peak_bytes
    assert len(fp32.step_time_runs_s) == 1 and fp32.step_time_s > 0
