"""Whole padded training steps (every half-precision op fed padded tensors as planned) vs the unpadded step."""

from __future__ import annotations

import pytest

from trainplan.align.study import plan_model, prove_model
from trainplan.export.trace import trace_training_step
from trainplan.models import build_model
from trainplan.precision.assign import assign_precision, fp32_dtypes
from trainplan.precision.interpreter import run_step
from trainplan.precision.lists import default_policy

# Odd widths and token counts so that every class of the models has something to pad.
ODD_GPT2 = {"architecture": "GPT2LMHeadModel", "config": {"n_layer": 1, "n_embd": 36, "n_head": 4, "vocab_size": 511, "n_positions": 32},
            "inputs": {"batch_size": 1, "seq_len": 15}}
ODD_CNN = {"source": "callable", "callable": "trainplan.zoo:small_cnn", "kwargs": {"channels": 5, "image_size": 7, "batch_size": 3}}


@pytest.mark.parametrize("name,spec", [("odd_gpt2", ODD_GPT2), ("odd_cnn", ODD_CNN)])
def test_padded_step_matches_unpadded(name, spec):
    traced, flat = trace_training_step(build_model(name, spec, seed=0))
    dtypes = assign_precision(traced.gm, default_policy(), traced.loss_node).dtype
    fp32 = run_step(traced.gm, flat, fp32_dtypes(traced.gm))
    for g in (4, 32):
        plans, _ = plan_model(traced.gm, dtypes, g)
        assert sum(p["pad_bytes"] for p in plans) < sum(p["naive_pad_bytes"] for p in plans)
        rows, step = prove_model(traced.gm, flat, dtypes, g, name, timing=(1, 0), fp32_ref=fp32)
        assert step["timed"] and (step["pad_s_ours"] > 0) == bool((rows.padded & (rows.strategy != "aligned")).any())
        assert step["distinct_ops_padded"] >= 3, step
        assert rows.within_tolerance.all(), rows[~rows.within_tolerance]
        assert (rows.strategy != "naive").all()
        assert step["within_fp16_roundoff"], step
    classes = set(rows[rows.padded].cls)
    assert classes >= ({"matmul", "attention"} if name == "odd_gpt2" else {"batch_norm", "convolution"}), classes


def test_tensor_core_rule_pads_more_matmuls_and_the_step_still_matches():
    """Under the tensor-core rule every matmul dimension is aligned: more bytes than the seed's rule, never more
    than naive in total, every matmul tensor aligned on every axis, and the padded step within fp16 round-off."""
    traced, flat = trace_training_step(build_model("odd_gpt2", ODD_GPT2, seed=0))
    dtypes = assign_precision(traced.gm, default_policy(), traced.loss_node).dtype
    fp32 = run_step(traced.gm, flat, fp32_dtypes(traced.gm))
    dma, _ = plan_model(traced.gm, dtypes, 16)
    tc, _ = plan_model(traced.gm, dtypes, 16, matmul_rule="tensor_core")
    pad = {name: {p["id"]: p["pad_bytes"] for p in plans if p["class"] == "matmul"} for name, plans in (("dma", dma), ("tc", tc))}
    assert sum(pad["tc"].values()) > sum(pad["dma"].values())
    assert sum(p["pad_bytes"] for p in tc) <= sum(p["naive_pad_bytes"] for p in tc)
    for p in tc:
        if p["class"] == "matmul":
            assert all(d % 8 == 0 for t in p["tensors"] if len(t["padded_view"]) > 1 for d in t["padded_view"][-2:]), p["id"]
    rows, step = prove_model(traced.gm, flat, dtypes, 16, "odd_gpt2", fp32_ref=fp32, matmul_rule="tensor_core")
    assert step["matmul_rule"] == "tensor_core" and rows.within_tolerance.all() and step["within_fp16_roundoff"], step
