"""Proof by execution: every op class and strategy run on padded tensors, unpadded, equals the unpadded op."""

from __future__ import annotations

import math

import pytest
import torch

from trainplan.align.classes import OpSpec, build_problem, resolve
from trainplan.align.execute import compare, naive_pad, pad_view, run_padded
from trainplan.align.problem import solve

H = torch.float16
aten = torch.ops.aten


def _run(op: str, bound: dict, outputs: dict, args: dict, g: int = 4, expect: str | None = None, matmul_rule: str = "dma"):
    """Plan the op on the bound tensors' shapes, run it padded and plain, compare."""
    target = resolve(op, "")
    inputs = {}
    for k, v in bound.items():
        if isinstance(v, torch.Tensor) and v.dtype == H:  # fp32 args (logsumexp) are not planned
            inputs[k] = tuple(v.shape)
        elif isinstance(v, list) and v and isinstance(v[0], torch.Tensor):
            inputs.update({f"{k}.{i}": tuple(t.shape) for i, t in enumerate(v)})
    spec = OpSpec("t", op, "float16", inputs, outputs, args)
    problem = build_problem(spec, matmul_rule)
    sol = solve(problem, 2 if g == 4 else g // 2)
    assert sol.padded, f"{op}: nothing padded, the test shape must need a pad"
    if expect is not None:
        assert {problem.axes[a].kind for a in sol.padded} == set(expect.split("+")), (op, sol.padded)
    clone = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in bound.items()}
    plain = target(**clone) if op not in ("aten.mm.default", "aten.addmm.default", "aten.bmm.default") else \
        target(**{k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in clone.items()}).half()
    shapes = [tuple(t.shape) for t in (plain if isinstance(plain, tuple) else [plain]) if isinstance(t, torch.Tensor)]
    padded = run_padded(target, bound, problem, sol.padded, shapes)
    return compare(padded, plain), problem, sol


def rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(H)


def test_elementwise_flat_with_broadcast():
    x, b = rnd(3, 5, 7), rnd(7, seed=1)
    c, _, _ = _run("aten.add.Tensor", {"self": x, "other": b}, {"out0": (3, 5, 7)}, {}, expect="flat")
    assert c.identical
    c, _, _ = _run("aten.tanh_backward.default", {"grad_output": x, "output": rnd(3, 5, 7, seed=2)}, {"out0": (3, 5, 7)}, {})
    assert c.identical


def test_softmax_rows_and_minus_inf_columns():
    c, _, _ = _run("aten._softmax.default", {"self": rnd(3, 5, 7), "dim": -1, "half_to_float": False},
                   {"out0": (3, 5, 7)}, {"dim": -1}, expect="rows")  # 15 rows of 7: one row (7) < a column (15)
    assert c.identical
    x = rnd(3, 41)
    c, _, _ = _run("aten._softmax.default", {"self": x, "dim": 1, "half_to_float": False}, {"out0": (3, 41)}, {"dim": 1}, expect="columns")
    assert c.within_tolerance
    y = aten._log_softmax.default(x, 1, False)
    c, _, _ = _run("aten._log_softmax_backward_data.default",
                   {"grad_output": rnd(3, 41, seed=3), "output": y, "dim": 1, "input_dtype": H},
                   {"out0": (3, 41)}, {"dim": 1}, expect="columns")
    assert c.within_tolerance


@pytest.mark.parametrize("m,k,n,expect", [(29, 3, 4, "rows"), (3, 29, 4, "columns"), (4, 3, 5, "aligned"), (9, 3, 5, "rows+output columns")])
def test_matmul_strategies(m, k, n, expect):
    a, b = rnd(m, k), rnd(k, n, seed=1)
    if expect == "aligned":  # 4 x 3 @ 3 x 5 -> 4 x 5: every operand has an even dim; the bias of 5 needs N
        c, _, sol = _run("aten.addmm.default", {"self": rnd(n, seed=2), "mat1": a, "mat2": b}, {"out0": (m, n)}, {})
        assert set(sol.padded) == {"N"}
    else:
        c, _, _ = _run("aten.mm.default", {"self": a, "mat2": b}, {"out0": (m, n)}, {}, expect=expect)
    assert c.within_tolerance


@pytest.mark.parametrize("op", ["aten.mm.default", "aten.addmm.default", "aten.bmm.default"])
def test_tensor_core_rule_pads_every_matmul_dimension_and_keeps_the_result(op):
    """g = 16 (q = 8): 5 x 7 @ 7 x 9 gets M, K and N padded to 8, 8, 16; the real block is the plain product."""
    m, k, n = 5, 7, 9
    if op == "aten.bmm.default":
        bound, out = {"self": rnd(2, m, k), "mat2": rnd(2, k, n, seed=1)}, (2, m, n)
    elif op == "aten.addmm.default":
        bound, out = {"self": rnd(n, seed=2), "mat1": rnd(m, k), "mat2": rnd(k, n, seed=1)}, (m, n)
    else:
        bound, out = {"self": rnd(m, k), "mat2": rnd(k, n, seed=1)}, (m, n)
    c, _, sol = _run(op, bound, {"out0": out}, {}, g=16, matmul_rule="tensor_core")
    assert sol.padded == {"M": 8, "K": 8, "N": 16} and c.within_tolerance


def test_bmm_rows_per_batch():
    c, problem, sol = _run("aten.bmm.default", {"self": rnd(3, 5, 7), "mat2": rnd(3, 7, 4, seed=1)}, {"out0": (3, 5, 4)}, {})
    assert c.within_tolerance and "B" not in sol.padded


def test_max_pool_minus_inf_columns_and_backward():
    x = rnd(1, 3, 6, 7) - 5  # all negative: a zero column would win the max
    kw = {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1], "dilation": [1, 1], "ceil_mode": False}
    out, idx = aten.max_pool2d_with_indices.default(x, **kw)
    c, _, sol = _run("aten.max_pool2d_with_indices.default", {"self": x, **kw}, {"out0": tuple(out.shape)}, {}, expect="columns")
    assert c.identical  # values and the remapped indices
    c, _, _ = _run("aten.max_pool2d_with_indices_backward.default",
                   {"grad_output": rnd(*out.shape, seed=4), "self": x, **kw, "indices": idx},
                   {"out0": tuple(x.shape)}, {})
    assert c.identical


@pytest.mark.parametrize("shape,expect", [((2, 5, 4, 4), "channels"), ((2, 4, 7, 7), "spatial"), ((2, 3, 3, 3), "channels+spatial")])
def test_batch_norm_training(shape, expect):
    x = rnd(*shape) * 3 + 1
    c_ = shape[1]
    w, b = rnd(c_, seed=1), rnd(c_, seed=2)
    rm, rv = torch.zeros(c_, dtype=H), torch.ones(c_, dtype=H)
    fwd = {"input": x, "weight": w, "bias": b, "running_mean": rm, "running_var": rv, "training": True, "momentum": 0.1, "eps": 1e-5}
    out, mean, invstd = aten.native_batch_norm.default(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in fwd.items()})
    outs = {"out0": shape, "out1": (c_,), "out2": (c_,)}
    c, _, _ = _run("aten.native_batch_norm.default", fwd, outs, {"training": True}, expect=expect)
    assert c.within_tolerance
    bwd = {"grad_out": rnd(*shape, seed=5), "input": x, "weight": w, "running_mean": rm, "running_var": rv, "save_mean": mean,
           "save_invstd": invstd, "train": True, "eps": 1e-5, "output_mask": [True, True, True]}
    c, _, _ = _run("aten.native_batch_norm_backward.default", bwd, outs, {"train": True}, expect=expect)
    assert c.within_tolerance
    if expect == "channels":
        assert c.identical


@pytest.mark.parametrize("op,dims,expect", [("aten.sum.dim_IntList", [0, 1], None), ("aten.mean.dim", [2, 3], "reduced"),
                                            ("aten.amax.default", [1], None)])
def test_reductions_neutral_values(op, dims, expect):
    x = rnd(3, 5, 7, 1) - 4 if "amax" in op else rnd(1, 3, 5, 7)
    ref = resolve(op, "")(x, dims, False)
    # the output forces its kept lanes even; planned on the input alone, a mean pads its reduced axis (rescaled)
    outputs = {} if expect == "reduced" else {"out0": tuple(ref.shape)}
    c, problem, sol = _run(op, {"self": x, "dim": dims, "keepdim": False}, outputs, {"dim": dims}, expect=expect)
    assert c.within_tolerance


def test_attention_head_dim_and_masked_sequence():
    q, k, v = rnd(1, 2, 7, 5), rnd(1, 2, 7, 5, seed=1), rnd(1, 2, 7, 5, seed=2)
    op = "aten._scaled_dot_product_flash_attention_for_cpu.default"
    # no mask, not causal: the sequence cannot be padded, the head dim is (scale passed as 1/sqrt(5))
    c, _, sol = _run(op, {"query": q, "key": k, "value": v, "dropout_p": 0.0, "is_causal": False},
                     {"out0": (1, 2, 7, 5)}, {"is_causal": False}, expect="columns")
    assert c.within_tolerance
    q7 = rnd(1, 2, 7, 4)
    mask = torch.zeros(1, 1, 7, 7, dtype=H).masked_fill(torch.rand(7, 7, generator=torch.Generator().manual_seed(1)) > 0.7, -math.inf)
    mask[..., 0] = 0
    c, _, sol = _run(op, {"query": q7, "key": q7, "value": q7, "dropout_p": 0.0, "is_causal": False, "attn_mask": mask},
                     {"out0": (1, 2, 7, 4)}, {"is_causal": False}, expect="rows")
    assert c.within_tolerance
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, True)
    c, _, sol = _run(op.replace(".default", "_backward.default"),
                     {"grad_out": rnd(1, 2, 7, 5, seed=3), "query": q, "key": k, "value": v, "out": out, "logsumexp": lse,
                      "dropout_p": 0.0, "is_causal": True}, {"out0": (1, 2, 7, 5), "out1": (1, 2, 7, 5), "out2": (1, 2, 7, 5)},
                     {"is_causal": True}, expect="rows")
    assert c.within_tolerance


def test_convolution_channels_forward_and_backward():
    x, w, b = rnd(2, 3, 6, 6), rnd(5, 3, 3, 3, seed=1), rnd(5, seed=2)
    conv = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "transposed": False, "output_padding": [0, 0], "groups": 1}
    target = aten.convolution.default
    c, _, sol = _run("aten.convolution.default", {"input": x, "weight": w, "bias": b, **conv}, {"out0": (2, 5, 6, 6)}, conv)
    assert c.within_tolerance and set(sol.padded) <= {"Cin", "Cout"}
    del target
    bwd = {"grad_output": rnd(2, 5, 6, 6, seed=3), "input": x, "weight": w, "bias_sizes": [5], **conv, "output_mask": [True, True, True]}
    c, _, sol = _run("aten.convolution_backward.default", bwd, {"out0": (2, 3, 6, 6), "out1": (5, 3, 3, 3), "out2": (5,)}, conv)
    assert c.within_tolerance


def test_embedding_and_concat():
    wt = rnd(11, 5)
    idx = torch.tensor([[1, 3, 10], [0, 0, 7]])
    c, _, _ = _run("aten.embedding.default", {"weight": wt, "indices": idx}, {"out0": (2, 3, 5)}, {})
    assert c.identical
    c, _, _ = _run("aten.cat.default", {"tensors": [rnd(3, 5), rnd(3, 2, seed=1)], "dim": 1}, {"out0": (3, 7)}, {"dim": 1}, expect="rows")
    assert c.identical


def test_pad_copies_match_plan_sizes():
    x = rnd(3, 5, 7)
    spec = OpSpec("t", "aten._softmax.default", "float16", {"self": (3, 5, 7)}, {}, {"dim": -1})
    problem = build_problem(spec)
    sol = solve(problem, 2)
    y = pad_view(x, problem.tensors[0], problem, sol.padded)
    assert y.numel() - x.numel() == sol.pad_elements and torch.equal(y[:15], x.reshape(15, 7))
    assert naive_pad(x, 2).shape == (4, 6, 8)
