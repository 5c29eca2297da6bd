"""I/O lower bound, the paper's tile and the simulated tiled dataflow (explicit fast memory of S elements)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainplan.layout.iobound import (ConvShape, buffered_tile, exact_dataflow_io, lower_bound, paper_io, paper_tile,
                                      simulate_dataflow)

SHAPES = [
    ConvShape(1, 16, 12, 12, 16, 3, 3, (1, 1), (1, 1)),
    ConvShape(2, 8, 9, 9, 12, 3, 3, (2, 2), (1, 1)),
    ConvShape(1, 32, 8, 8, 24, 1, 1),
    ConvShape(1, 12, 10, 10, 12, 3, 3, (1, 1), (1, 1), groups=12),
    ConvShape(1, 3, 23, 23, 8, 7, 7, (2, 2), (3, 3)),
]


@pytest.mark.parametrize("conv", SHAPES, ids=lambda c: f"c{c.cin}k{c.kh}s{c.stride[0]}g{c.groups}")
@pytest.mark.parametrize("s", [300, 2048])
def test_simulated_dataflow_computes_the_conv_and_counts_its_formula(conv, s):
    rng = np.random.default_rng(1)
    inp = rng.standard_normal((conv.n, conv.cin, conv.h, conv.w))
    wgt = rng.standard_normal((conv.cout, conv.cin_g, conv.kh, conv.kw))
    sim = simulate_dataflow(conv, s, inputs=inp, weights=wgt)
    ref = torch.nn.functional.conv2d(torch.from_numpy(inp), torch.from_numpy(wgt), stride=conv.stride,
                                     padding=conv.padding, groups=conv.groups).numpy()
    np.testing.assert_allclose(sim["output"], ref, rtol=1e-10, atol=1e-10)
    assert sim["peak"] <= s
    exact = exact_dataflow_io(conv, *sim["tile"])
    assert (sim["reads"], sim["writes"]) == (exact["reads"], exact["writes"])
    assert sim["writes"] == conv.n * conv.cout * conv.hout * conv.wout
    # a lower bound must not exceed what a real dataflow does
    assert sim["io"] >= lower_bound(conv, s)["bound"]


def test_paper_formula_equals_the_count_when_tiles_divide_and_nothing_overlaps():
    conv = ConvShape(1, 16, 8, 8, 16, 1, 1)  # 1x1, stride 1: no halo, R = 1
    x, y, z = 4, 4, 8
    assert exact_dataflow_io(conv, x, y, z)["io"] == paper_io(conv, x, y, z)
    assert simulate_dataflow(conv, 4 * 4 * 8 + 4 * 4 + 8, (x, y, z))["io"] == paper_io(conv, x, y, z)


def test_paper_tile_fills_s_over_np_and_balances_xy_with_rz():
    conv = ConvShape(1, 256, 56, 56, 256, 3, 3, (1, 1), (1, 1))
    for s, cores in [(4096, 1), (65536, 4)]:
        x, y, z = paper_tile(conv, s, cores)
        assert x * y * z <= s / cores and x * y * z >= 0.9 * s / cores
        assert 0.5 <= x * y / (conv.reuse * z) <= 2.0
        ratio = paper_io(conv, x, y, z) / lower_bound(conv, s / cores)["bound"]
        assert 1.0 <= ratio < 1.2


def test_buffered_tile_is_refused_when_nothing_fits():
    with pytest.raises(ValueError, match="cannot hold"):
        buffered_tile(ConvShape(1, 4, 8, 8, 4, 7, 7, (1, 1), (3, 3)), 40)
