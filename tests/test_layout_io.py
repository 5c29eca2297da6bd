"""I/O lower bound, the paper's tile and the simulated tiled dataflow (explicit fast memory of S elements)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from trainplan.layout.iobound import (FLOWS, ConvShape, Dataflow, best_dataflow, exact_dataflow_io, lower_bound,
                                      paper_io, paper_tile, simulate_dataflow)

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
    sim = _check_simulation(conv, s, None)
    assert sim["peak"] <= s
    # a lower bound must not exceed what a real dataflow does
    assert sim["io"] >= lower_bound(conv, s)["bound"]


@pytest.mark.parametrize("conv", SHAPES + [ConvShape(1, 6, 11, 11, 5, 1, 1, (2, 2))],
                         ids=lambda c: f"c{c.cin}k{c.kh}s{c.stride[0]}g{c.groups}")
@pytest.mark.parametrize("order,stream,keep", [(*f, 0) for f in FLOWS] + [("output", "rows", 2), ("output", "taps", 3)])
def test_every_dataflow_computes_the_conv_and_counts_its_formula_with_its_buffer(conv, order, stream, keep):
    flow = Dataflow(min(3, conv.wout), min(2, conv.hout), min(5, conv.cout_g), order, stream, b=conv.n, keep=keep)
    sim = _check_simulation(conv, 10**6, flow)
    px = max(len(set(range(x0 * conv.stride[1] - conv.padding[1], (x0 + flow.x - 1) * conv.stride[1]
                           - conv.padding[1] + conv.kw)) & set(range(conv.w))) for x0 in range(0, conv.wout, flow.x))
    py = max(len(set(range(y0 * conv.stride[0] - conv.padding[0], (y0 + flow.y - 1) * conv.stride[0]
                           - conv.padding[0] + conv.kh)) & set(range(conv.h))) for y0 in range(0, conv.hout, flow.y))
    buffer = {("output", "rows"): conv.kh * conv.kw * flow.z + px, ("output", "taps"): flow.b * px * py + flow.z,
              ("input", "taps"): flow.b * conv.cin_g * px * py + flow.z}[order, stream]
    assert sim["peak"] <= flow.b * flow.x * flow.y * flow.z + buffer + min(keep, conv.cin_g) * flow.b * px * py


def test_kept_channels_save_their_reads_on_every_block_after_the_first():
    conv = ConvShape(1, 64, 14, 14, 64, 3, 3, (1, 1), (1, 1))
    plain, kept = (exact_dataflow_io(conv, Dataflow(14, 14, 32, "output", "rows", keep=k))["reads"] for k in (0, 8))
    assert plain - kept == 8 * 14 * 14  # two blocks: the second reads 8 whole channels (196 inputs each) fewer
    best = best_dataflow(conv, 8192)
    assert best.keep > 0 and simulate_dataflow(conv, 8192, best)["peak"] <= 8192
    io = exact_dataflow_io(conv, best)["io"]
    for (order, stream), x, y in itertools.product(FLOWS, range(1, 15), range(1, 15)):  # without kept channels
        z = next((z for z in range(1, 65) if exact_dataflow_io(conv, Dataflow(x, y, z, order, stream))["io"] <= io),
                 None)  # the smallest z moving no more than the best must not fit (larger ones need more memory)
        if z is not None:
            with pytest.raises(MemoryError):
                simulate_dataflow(conv, 8192, Dataflow(x, y, z, order, stream))
    with pytest.raises(ValueError, match="keep"):
        Dataflow(2, 2, 2, "input", "taps", keep=1)


def test_best_dataflow_fits_its_memory_and_no_other_fitting_dataflow_moves_less():
    conv = ConvShape(2, 8, 9, 9, 12, 3, 3, (2, 2), (1, 1))
    s = 260
    best = best_dataflow(conv, s)
    assert simulate_dataflow(conv, s, best)["peak"] <= s
    io = exact_dataflow_io(conv, best)["io"]
    for (order, stream), b in itertools.product(FLOWS, (1, 2)):  # every tile: the cheaper ones must not fit s
        for x, y, z in itertools.product(range(1, conv.wout + 1), range(1, conv.hout + 1), range(1, conv.cout_g + 1)):
            flow = Dataflow(x, y, z, order, stream, b)
            if exact_dataflow_io(conv, flow)["io"] < io:
                with pytest.raises(MemoryError):
                    simulate_dataflow(conv, s, flow)


def test_images_in_one_tile_share_each_weight_read():
    conv = ConvShape(2, 16, 4, 4, 32, 1, 1)  # weights (512) outweigh each image's activations (64 + 128)
    one, both = (exact_dataflow_io(conv, Dataflow(4, 4, 32, "input", "taps", b))["reads"] for b in (1, 2))
    assert one - both == 16 * 32
    assert best_dataflow(conv, 2 * (16 * 16 + 16 * 32) + 32).b == 2


def test_compulsory_io_counts_only_inputs_a_window_reads():
    conv = ConvShape(2, 4, 9, 9, 3, 1, 1, (2, 2))  # a 1x1 stride-2 conv reads 5 x 5 of the 9 x 9 positions
    assert lower_bound(conv, 1e9)["compulsory"] == 2 * 4 * 25 + 3 * 4 + 2 * 3 * 25
    one = ConvShape(1, 4, 9, 9, 3, 1, 1, (2, 2))  # one image: weights read once too
    whole = Dataflow(one.wout, one.hout, 1, "input", "taps")  # one spatial tile: every input read once
    assert exact_dataflow_io(one, whole)["io"] == lower_bound(one, 1e9)["compulsory"]


def _check_simulation(conv: ConvShape, s: int, flow: Dataflow | None) -> dict:
    """Simulate, check the output against torch's conv and the counts against the exact formula."""
    rng = np.random.default_rng(1)
    inp = rng.standard_normal((conv.n, conv.cin, conv.h, conv.w))
    wgt = rng.standard_normal((conv.cout, conv.cin_g, conv.kh, conv.kw))
    sim = simulate_dataflow(conv, s, flow, inputs=inp, weights=wgt)
    ref = torch.nn.functional.conv2d(torch.from_numpy(inp), torch.from_numpy(wgt), stride=conv.stride,
                                     padding=conv.padding, groups=conv.groups).numpy()
    np.testing.assert_allclose(sim["output"], ref, rtol=1e-10, atol=1e-10)
    exact = exact_dataflow_io(conv, sim["flow"])
    assert (sim["reads"], sim["writes"]) == (exact["reads"], exact["writes"])
    assert sim["writes"] == conv.n * conv.cout * conv.hout * conv.wout
    return sim


def test_paper_formula_equals_the_count_when_tiles_divide_and_nothing_overlaps():
    conv = ConvShape(1, 16, 8, 8, 16, 1, 1)  # 1x1, stride 1: no halo, R = 1
    x, y, z = 4, 4, 8
    flow = Dataflow(x, y, z, "output", "taps")
    assert exact_dataflow_io(conv, flow)["io"] == paper_io(conv, x, y, z)
    assert simulate_dataflow(conv, 4 * 4 * 8 + 4 * 4 + 8, flow)["io"] == paper_io(conv, x, y, z)


def test_paper_tile_fills_s_over_np_and_balances_xy_with_rz():
    conv = ConvShape(1, 256, 56, 56, 256, 3, 3, (1, 1), (1, 1))
    for s, cores in [(4096, 1), (65536, 4)]:
        x, y, z = paper_tile(conv, s, cores)
        assert x * y * z <= s / cores and x * y * z >= 0.9 * s / cores
        assert 0.5 <= x * y / (conv.reuse * z) <= 2.0
        ratio = paper_io(conv, x, y, z) / lower_bound(conv, s / cores)["bound"]
        assert 1.0 <= ratio < 1.2


def test_best_dataflow_is_refused_when_nothing_fits():
    with pytest.raises(ValueError, match="cannot hold"):
        best_dataflow(ConvShape(1, 4, 8, 8, 4, 7, 7, (1, 1), (3, 3)), 40)
