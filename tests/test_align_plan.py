"""Padding planner and ``trainplan align`` CLI against an independent computation of the seed's padding."""

from __future__ import annotations

import json
import math
import random

import pytest

from trainplan.align.classes import OpSpec
from trainplan.align.plan import plan_op
from trainplan.align.units import AlignError
from trainplan.cli import main


def ru(n: int, q: int) -> int:
    return (n + q - 1) // q * q


# Independent formulas, written from the seed (001) text, not from the planner's code.
def seed_1d(shape, q):
    """s1: pad the flat length n*c*h*w at the end."""
    return ru(math.prod(shape), q) - math.prod(shape)


def seed_2d(n, m, q, batch=1):
    """s2: n x m needs n or m a multiple of q; add rows (m each) or columns (n each), fewer elements wins."""
    if n % q == 0 or m % q == 0:
        return 0
    return batch * min((ru(n, q) - n) * m, (ru(m, q) - m) * n)


def seed_3d(n, c, hw, q):
    """s3: n, c, h*w with c and h*w multiples of q (h*w zeros after each c*h*w block for c)."""
    return n * (ru(c, q) * ru(hw, q) - c * hw)


def naive(shape, q):
    return math.prod(ru(d, q) for d in shape) - math.prod(shape)


def run_cli(tmp_path, ops, granularity=4, *extra):
    src, out = tmp_path / "ops.json", tmp_path / "plan.json"
    src.write_text(json.dumps({"ops": ops}))
    rc = main(["align", str(src), "-o", str(out), "--granularity", str(granularity), *extra])
    return rc, (json.loads(out.read_text()) if out.exists() else None)


def _shapes(rng, count, rank):
    return [[rng.randint(1, 13) for _ in range(rank)] for _ in range(count)]


@pytest.mark.parametrize("granularity,dtype,q", [(4, "float16", 2), (16, "float16", 8), (32, "bfloat16", 16), (4, "float32", 1)])
def test_cli_matches_seed_formulas_on_unseen_shapes(tmp_path, granularity, dtype, q):
    rng = random.Random(granularity * 7 + q)
    ops, expect = [], {}
    for i, s in enumerate(_shapes(rng, 12, 4)):
        n, c, h, w = s
        cases = [
            ("aten.tanh.default", {}, seed_1d(s, q)),
            ("aten._softmax.default", {"dim": -1}, seed_2d(n * c * h, w, q)),
            ("aten.max_pool2d_with_indices.default", {"args": {"kernel_size": [2, 2]}}, seed_2d(n, w, q) and
             min((ru(n, q) - n) * c * h * w, (ru(w, q) - w) * n * c * h)),
            ("aten.native_batch_norm.default", {"args": {"training": True}}, seed_3d(n, c, h * w, q)),
            ("aten._native_batch_norm_legit_no_training.default", {},
             0 if n % q == 0 or (h * w) % q == 0 else min((ru(n, q) - n) * c * h * w, (ru(h * w, q) - h * w) * n * c)),
        ]
        for op, extra, pad in cases:
            ops.append({"id": f"{op}-{i}", "op": op, "shape": s, "dtype": dtype, **extra})
            expect[f"{op}-{i}"] = (pad, naive(s, q))
        ops.append({"id": f"mm-{i}", "op": "aten.mm.default", "shape": [n * c, h * w], "dtype": dtype})
        expect[f"mm-{i}"] = (seed_2d(n * c, h * w, q), naive([n * c, h * w], q))
    rc, plan = run_cli(tmp_path, ops, granularity)
    assert rc == 0
    for p in plan["ops"]:
        want, want_naive = expect[p["id"]]
        assert (p["pad_elements"], p["naive_pad_elements"]) == (want, want_naive), p["id"]
        assert p["pad_elements"] <= p["naive_pad_elements"]
        assert p["pad_bytes"] == p["pad_elements"] * (4 if dtype == "float32" else 2)
        if want == 0:
            assert p["strategy"] == "aligned" and p["padded_shape"] == p["tensors"][0]["view"]
    t = plan["totals"]
    assert t["pad_bytes"] == sum(p["pad_bytes"] for p in plan["ops"])
    if q > 1:
        assert t["pad_bytes"] < t["naive_pad_bytes"]


def test_issue_example_and_pad_values(tmp_path):
    rc, plan = run_cli(tmp_path, [
        {"id": "x", "op": "aten._softmax.default", "shape": [3, 5, 7, 9], "dtype": "float16", "dim": -1},
        {"id": "wide", "op": "aten._softmax.default", "shape": [4, 9], "dim": -1},
        {"id": "odd", "op": "aten._softmax.default", "shape": [3, 101], "dim": 1},
        {"id": "amax", "op": "aten.amax.default", "shape": [5, 9], "args": {"dim": [1]}},
        {"id": "mean", "op": "aten.mean.dim", "shape": [1, 3, 7, 7], "dim": [2, 3]},
    ])
    assert rc == 0
    by = {p["id"]: p for p in plan["ops"]}
    x = by["x"]  # n = 105 rows of m = 9: a row (9 zeros) beats a column (105)
    assert (x["class"], x["strategy"], x["padded_shape"], x["pad_elements"]) == ("softmax", "rows", [106, 9], 9)
    assert {"id", "class", "strategy", "padded_shape", "pad_layout", "pad_elements", "pad_value", "naive_pad_elements"} <= set(x)
    assert by["wide"]["strategy"] == "aligned"
    odd = by["odd"]  # 3 x 101: a column (3) beats a row (101); the column is -inf
    assert (odd["strategy"], odd["pad_elements"], odd["pad_value"]) == ("columns", 3, "columns: -inf")
    assert by["amax"]["pad_value"] == "reduced: -inf" and by["amax"]["pad_elements"] == 5
    assert by["mean"]["pad_value"] == "reduced: 0 (rescaled)" and by["mean"]["pad_elements"] == 3
    assert "real count" in by["mean"]["pad_layout"]["R"]["reason"]


def test_matmul_plans_all_operands_jointly():
    # 101 x 3 @ 3 x 5 + bias 5: the bias forces N even, then a row of the left operand beats its 101 columns.
    p = plan_op(OpSpec("fc", "aten.addmm.default", "float16",
                       {"mat1": (101, 3), "mat2": (3, 5), "self": (5,)}, {"out0": (101, 5)}), 4)
    pads = {t["role"]: t["pad_elements"] for t in p["tensors"]}
    assert pads == {"mat1": 3, "mat2": 3, "self": 1, "out0": 102 * 6 - 505}
    assert all(not t["aligned_before"] for t in p["tensors"])
    # every tensor aligned after planning: its padded view meets the 2-D rule
    for t in p["tensors"]:
        v = t["padded_view"]
        assert math.prod(v) % 2 == 0 and (len(v) == 1 or v[-1] % 2 == 0 or v[-2] % 2 == 0)


def test_tensor_core_rule_pads_a_vocabulary_the_dma_rule_leaves_alone(tmp_path):
    """GPT-2's LM head, 256 tokens x 768 @ 768 x 50257 at g = 16 (q = 8): the rows are aligned, so the seed's rule
    pads nothing; the tensor-core rule pads N to 50264 in the weight and the output, and nothing else."""
    lm_head = {"id": "lm_head", "op": "aten.mm.default", "shape": [256, 768], "dtype": "float16",
               "inputs": {"mat2": [768, 50257]}, "outputs": {"out0": [256, 50257]}}
    rc, plan = run_cli(tmp_path, [lm_head], 16)
    assert rc == 0 and plan["matmul_rule"] == "dma" and plan["ops"][0]["strategy"] == "aligned"
    rc, plan = run_cli(tmp_path, [lm_head], 16, "--matmul-rule", "tensor_core")
    op = plan["ops"][0]
    assert rc == 0 and plan["matmul_rule"] == "tensor_core" and op["strategy"] == "output columns"
    assert {a: v["padded"] for a, v in op["pad_layout"].items()} == {"N": 50264}
    assert {t["role"]: t["pad_elements"] for t in op["tensors"]} == {"self": 0, "mat2": 768 * 7, "out0": 256 * 7}
    # every dimension of every operand a multiple of 8 after the plan
    assert all(d % 8 == 0 for t in op["tensors"] for d in t["padded_view"])


def test_an_unknown_matmul_rule_is_named():
    spec = OpSpec("fc", "aten.mm.default", "float16", {"self": (4, 4), "mat2": (4, 4)}, {"out0": (4, 4)})
    with pytest.raises(AlignError, match="matmul rule 'tensor' is not one of dma, tensor_core"):
        plan_op(spec, 4, "tensor")


def test_every_class_never_above_naive():
    rng = random.Random(3)
    for _ in range(40):
        n, c, h, w = (rng.randint(1, 9) for _ in range(4))
        specs = [
            OpSpec("c", "aten.convolution.default", "float16", {"input": (n, c, h, w), "weight": (c + 2, c, 3, 3)},
                   {"out0": (n, c + 2, h, w)}, {"groups": 1}),
            OpSpec("a", "aten._scaled_dot_product_flash_attention_for_cpu.default", "float16",
                   {"query": (n, c, h, w), "key": (n, c, h, w), "value": (n, c, h, w)}, {"out0": (n, c, h, w)}, {"is_causal": True}),
            OpSpec("e", "aten.embedding.default", "float16", {"weight": (h * 7, w)}, {"out0": (n, c, w)}),
            OpSpec("k", "aten.cat.default", "float16", {"tensors.0": (n, c, h), "tensors.1": (n, c, w)}, {"out0": (n, c, h + w)}, {"dim": 2}),
            OpSpec("b", "aten.bmm.default", "float16", {"self": (n, c, h), "mat2": (n, h, w)}, {"out0": (n, c, w)}),
        ]
        for g in (4, 16, 32):
            for spec in specs:
                p = plan_op(spec, g)
                assert p["pad_elements"] <= p["naive_pad_elements"], (spec, g)
                assert all(t["aligned_after"] for t in p["tensors"]), (spec, g)
                # the planned pad is exactly the padded views' extra elements
                assert p["pad_elements"] == sum(math.prod(t["padded_view"]) - math.prod(t["shape"]) for t in p["tensors"])


@pytest.mark.parametrize("entry,needle", [
    ({"id": "bad", "op": "aten.no_such_op.default", "shape": [2, 3]}, "op 'bad': unknown op"),
    ({"id": "neg", "op": "aten.relu.default", "shape": [2, -3]}, "op 'neg': bad shape"),
    ({"id": "dt", "op": "aten.relu.default", "shape": [2, 3], "dtype": "float8"}, "op 'dt': unknown dtype"),
    ({"id": "rank", "op": "aten.mm.default", "shape": [2, 3, 4]}, "op 'rank'"),
    ({"id": "dim", "op": "aten._softmax.default", "shape": [2, 3], "dim": 5}, "op 'dim'"),
])
def test_cli_bad_input_exits_2_without_output(tmp_path, capsys, entry, needle):
    good = {"id": "ok", "op": "aten.relu.default", "shape": [3]}
    rc, plan = run_cli(tmp_path, [good, entry])
    assert rc == 2 and plan is None
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
