"""Layout stage on real models: reference CNNs, the traced conv graph, measured problems, executed plans."""

from __future__ import annotations

import copy
import math
from dataclasses import asdict

import pandas as pd
import pytest
import torch

from trainplan.layout.build import build_problem
from trainplan.layout.execute import apply_layouts, check_gradients, gradient_reference
from trainplan.layout.graph import INPUT, ConvInfo, trace_conv_graph
from trainplan.layout.measure import Timing, measure_graph
from trainplan.layout.predict import (FEATURES, SIZES, fit, measure_sweep, outside_sweep, predict, score, sweep_shapes,
                                      sweep_sizes)
from trainplan.layout.solve import plan_time, solve
from trainplan.models import build_model
from trainplan.zoo import alexnet, resnet18, vgg11

FAST = Timing(repeats=1, warmup=0, threads=1)


@pytest.mark.parametrize("factory, params, convs", [(resnet18, 11_689_512, 20), (alexnet, 61_100_840, 5),
                                                     (vgg11, 132_863_336, 8)])
def test_reference_cnns_have_torchvision_sizes(factory, params, convs):
    module, batch = factory(image_size=64, batch_size=1)
    assert sum(p.numel() for p in module.parameters()) == params
    assert sum(isinstance(m, torch.nn.Conv2d) for m in module.modules()) == convs
    assert module(**batch).dim() == 0


def test_resnet18_graph_has_residual_edges_and_is_a_dag():
    module, batch = resnet18(image_size=32, batch_size=2)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    graph = trace_conv_graph("resnet18", module, batch)
    assert list(graph.convs)[:2] == ["features.0", "features.4.conv1"]
    assert (INPUT, "features.0") in graph.edges
    # identity shortcut of the first block: the stem's group feeds the add in conv2's group
    assert ("features.0", "features.4.conv2") in graph.edges
    # downsample block: its 1x1 conv and conv1 both read the previous block's output
    assert ("features.5.conv2", "features.6.downsample.0") in graph.edges
    assert ("features.5.conv2", "features.6.conv1") in graph.edges
    names = {op.name for op in graph.ops}
    assert {"aten.add.Tensor", "aten.relu_.default", "aten.max_pool2d_with_indices.default"} <= names
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())  # BN statistics restored


def test_measured_problem_plans_and_executes_with_matching_gradients():
    built = build_model("resnet18", {"source": "callable", "callable": "trainplan.zoo:resnet18",
                                     "kwargs": {"image_size": 64, "batch_size": 4}})
    graph = trace_conv_graph(built.name, built.module, built.batch)
    tables = measure_graph(graph, ["nchw", "nhwc"], FAST)
    for name, table in tables.items():
        values = table.filter(regex="^(fwd|bwd)_|->").to_numpy().ravel()
        assert len(values) and all(math.isfinite(v) and v >= 0 for v in values), name
    assert (tables["groups"].error == "").all()
    problem = build_problem(built.name, tables["convs"], tables["groups"], tables["edges"], ["nchw", "nhwc"])
    plan = solve(problem, "exact")
    assert plan.status == "optimal" and plan.time == pytest.approx(plan_time(problem, plan.layouts))
    # a deliberately mixed plan: every other conv in NHWC
    mixed = {c: ("nhwc" if i % 2 else "nchw") for i, c in enumerate(graph.convs)}
    run = apply_layouts(built.module, mixed, "mixed")
    seen = {}
    for name, conv in run.module.named_modules():
        if isinstance(conv, torch.nn.Conv2d):
            conv.register_forward_hook(lambda m, a, o, name=name: seen.__setitem__(
                name, a[0].is_contiguous(memory_format=torch.channels_last) and a[0].shape[1] > 1))
            if conv.kernel_size != (1, 1):  # a 1x1 kernel's weight is contiguous in both formats
                assert conv.weight.is_contiguous(memory_format=torch.channels_last) == (mixed[name] == "nhwc")
    ref = gradient_reference(built.module, built.batch, built.loss_fn, atol=1e-5)
    check = check_gradients(ref, run.module, built.batch, built.loss_fn, rtol=1e-4, atol=1e-5)
    assert check["ok"], check
    assert {n for n, cl in seen.items() if cl} == {n for n, lay in mixed.items() if lay == "nhwc"}


def _resnet18(image_size: int):
    return build_model("resnet18", {"source": "callable", "callable": "trainplan.zoo:resnet18",
                                    "kwargs": {"image_size": image_size, "batch_size": 2}}, seed=0)


def test_gradient_check_is_against_float64_and_catches_a_wrong_step():
    built = _resnet18(32)  # the last stage's batch norms see 2 values: float32 gradients are far from exact
    convs = [n for n, m in built.module.named_modules() if isinstance(m, torch.nn.Conv2d)]
    nhwc = apply_layouts(built.module, {c: "nhwc" for c in convs}, "all_nhwc")
    ref = gradient_reference(built.module, built.batch, built.loss_fn, atol=1e-5)
    check = check_gradients(ref, nhwc.module, built.batch, built.loss_fn, rtol=1e-4, atol=1e-5)
    assert check["ok"] and 0 <= check["worst_grad_ratio"] <= 1 and check["exact_ratio"] < 1e-3
    assert abs(check["exact_loss"] - check["reference_loss"]) < 1e-4 * abs(check["exact_loss"])
    built = _resnet18(64)
    wrong = apply_layouts(built.module, {}, "wrong")
    with torch.no_grad():
        dict(wrong.module.named_parameters())[f"{convs[3]}.weight"].mul_(1.01)  # not the same model any more
    ref = gradient_reference(built.module, built.batch, built.loss_fn, atol=1e-5)
    bad = check_gradients(ref, wrong.module, built.batch, built.loss_fn, rtol=1e-4, atol=1e-5)
    assert not bad["ok"] and bad["exact_ratio"] > 1 and bad["exact_param"] == f"{convs[3]}.weight"


def test_predictor_trains_on_a_sweep_and_scores_held_out_convs():
    shapes = sweep_shapes(40, seed=3, batch_size=1, max_macs=2e6)
    table = measure_sweep(shapes, ["nchw", "nhwc"], FAST)
    model = fit(table.iloc[:30], ["nchw", "nhwc"], seed=0)
    pred = predict(model, table.iloc[30:], ["nchw", "nhwc"])
    assert (pred.to_numpy() > 0).all() and list(pred.index) == list(table.conv[30:])
    scores = score(model, table.iloc[30:], ["nchw", "nhwc"])
    assert scores["rows"] == 20 and math.isfinite(scores["r2"]) and scores["median_rel_error"] >= 0
    again = fit(table.iloc[:30], ["nchw", "nhwc"], seed=0)
    assert (predict(again, table.iloc[30:], ["nchw", "nhwc"]) == pred).all().all()  # deterministic for a seed


def _macs(conv: ConvInfo) -> int:
    return math.prod(conv.out_shape) * math.prod(conv.weight_shape[1:])


def test_the_sweep_reaches_the_study_image_and_convs_beyond_it_are_counted():
    assert sweep_sizes(64) == SIZES  # the CPU study's sweep is unchanged
    assert {112, 113, 224, 225} <= set(sweep_sizes(224)) and max(sweep_sizes(224)) == 225
    big = sweep_shapes(400, seed=0, batch_size=32, max_macs=1e11, image_size=224)
    assert max(c.in_shape[2] for c in big) > 65 and max(map(_macs, big)) <= 1e11
    assert sum(_macs(c) > 1e10 for c in big) >= 20
    small = sweep_shapes(60, seed=0, batch_size=2, max_macs=4e8, image_size=64)
    sweep = pd.DataFrame([{**asdict(c), "conv": c.id, "error": ""} for c in small])
    top_side = max(c.in_shape[2] for c in small)
    top_macs = max(map(_macs, small))
    inside = ConvInfo("in", (2, 16, 8, 8), (16, 16, 3, 3), (2, 16, 8, 8), (1, 1), (1, 1), (1, 1), 1, False, "float32")
    wide = ConvInfo("wide", (2, 3, top_side + 8, top_side + 8), (4, 3, 1, 1), (2, 4, top_side + 8, top_side + 8),
                    (1, 1), (0, 0), (1, 1), 1, False, "float32")  # few multiply-adds, a larger side
    heavy = ConvInfo("heavy", (2, 2048, 32, 32), (2048, 2048, 3, 3), (2, 2048, 32, 32), (1, 1), (1, 1), (1, 1), 1,
                     False, "float32")
    assert _macs(inside) < top_macs < _macs(heavy) and _macs(wide) < top_macs
    convs = pd.DataFrame([{**asdict(c), "conv": c.id} for c in (inside, wide, heavy)])
    assert outside_sweep(sweep, convs) == 2 and outside_sweep(sweep, convs.iloc[:1]) == 0
    sweep.loc[sweep.in_shape.map(lambda s: s[2]) == top_side, "error"] = "crashed"  # untimed rows do not count
    assert outside_sweep(sweep, convs.iloc[:1].assign(in_shape=[(2, 16, top_side, top_side)])) == 1


def test_a_shape_that_crashes_torch_is_left_out_and_the_sweep_goes_on():
    # PyTorch 2.13's CPU backward of a channels_last 1x1 stride-2 conv with < 16 input channels corrupts the heap
    crash = ConvInfo("crash", (2, 3, 64, 64), (160, 3, 1, 1), (2, 160, 32, 32), (2, 2), (0, 0), (1, 1), 1, False,
                     "float32")
    bad = ConvInfo("bad", (1, 6, 8, 8), (4, 4, 3, 3), (1, 4, 6, 6), (1, 1), (0, 0), (1, 1), 4, False, "float32")
    # plain 3x3 convs with 16 channels: timed on every CPU tried (a 3-channel 4x4 patchify conv from the sweep
    # also crashed channels_last on CI's CPU, so the rows that must be timed are not drawn at random)
    plain = [ConvInfo(f"plain{i}", (1, 16, 8, 8), (16, 16, 3, 3), (1, 16, 8, 8), (1, 1), (1, 1), (1, 1), 1, bool(i),
                      "float32") for i in range(2)]
    shapes = [plain[0], bad, crash, plain[1]]
    table = measure_sweep(shapes, ["nchw", "nhwc"], FAST)
    assert list(table.conv) == [s.id for s in shapes]
    timed = table.iloc[[0, 3]]
    assert (timed.error == "").all() and (timed[["fwd_nchw", "bwd_nchw", "fwd_nhwc", "bwd_nhwc"]] > 0).all().all()
    assert table.error[1].startswith("RuntimeError") and math.isnan(table.fwd_nchw[1])  # 6 channels in 4 groups
    # the known crash of torch 2.13 (measure.known_crash) is not run at all: no worker dies on it, the next goes on
    assert table.error[2].startswith("known PyTorch crash") and math.isnan(table.fwd_nhwc[2])
    model = fit(table, ["nchw", "nhwc"], seed=0)  # the rows without times are not trained on
    assert model.n_features_in_ == len(FEATURES)


def test_the_sweep_starts_no_shape_after_its_time_limit_and_keeps_a_prefix():
    crash = ConvInfo("crash", (2, 3, 64, 64), (160, 3, 1, 1), (2, 160, 32, 32), (2, 2), (0, 0), (1, 1), 1, False,
                     "float32")  # known_crash on the CPU: never run, its row is written without a worker
    plain = ConvInfo("plain", (1, 16, 8, 8), (16, 16, 3, 3), (1, 16, 8, 8), (1, 1), (1, 1), (1, 1), 1, False,
                     "float32")
    late = measure_sweep([crash, plain, crash], ["nchw", "nhwc"], FAST, time_limit=1e-9)
    assert list(late.conv) == ["crash"]  # the rows before the first shape left untimed, and none after it
    timed = measure_sweep([crash, plain, crash], ["nchw", "nhwc"], FAST, time_limit=600)
    assert list(timed.conv) == ["crash", "plain", "crash"] and timed.error[1] == "" and timed.fwd_nhwc[1] > 0
    assert measure_sweep([plain], ["nchw"], FAST, time_limit=1e-9).empty


@pytest.mark.parametrize("arch, cfg", [
    ("ResNetForImageClassification", {"depths": [1, 1], "hidden_sizes": [32, 64], "embedding_size": 16}),
    ("ConvNextForImageClassification", {"depths": [1, 1, 1, 1], "hidden_sizes": [8, 16, 32, 64]}),
])
def test_every_group_of_transformers_cnns_replays_in_both_layouts(arch, cfg):
    from trainplan.layout.measure import group_forward

    built = build_model("m", {"source": "transformers", "architecture": arch, "config": cfg,
                              "inputs": {"batch_size": 2, "image_size": 32}})
    graph = trace_conv_graph("m", built.module, built.batch)
    # transformers' ResNet adds the shortcut in place (hidden += residual): the in-place op re-makes its input
    assert any(op.name == "aten.add_.Tensor" for op in graph.ops) == arch.startswith("ResNet")
    for group in graph.groups:
        if any(op.group == group for op in graph.ops):
            for layout in ("nchw", "nhwc"):
                outs = group_forward(graph, group, layout)()
                assert outs and all(torch.isfinite(o).all() for o in outs)


def test_timing_on_a_gpu_needs_the_wall_clock():
    """Process CPU time does not see a GPU's work: a CUDA timing with it is refused, naming the device."""
    from trainplan.layout.measure import Timing, device_facts

    with pytest.raises(ValueError, match="cuda"):
        Timing(clock="process", device="cuda")
    with pytest.raises(ValueError, match="clock 'cpu'"):
        Timing(clock="cpu")
    assert Timing(clock="wall", device="cuda").device == "cuda"
    assert device_facts("cpu") == {"type": "cpu"}


def test_median_time_counts_one_call_of_back_to_back_runs():
    """With ``calls`` > 1 every timed run makes that many calls and the time is per call, not per run."""
    import time as clock

    from trainplan.layout.measure import Timing, median_time

    made = []

    def fn():
        made.append(1)
        clock.sleep(0.01)

    t = median_time(fn, Timing(repeats=3, warmup=1, clock="wall", calls=3))
    assert len(made) == 1 + 3 * 3
    assert 0.009 < t < 0.025, t  # per call (a run of three takes >= 0.03 s)
    with pytest.raises(ValueError, match="calls"):
        Timing(calls=0)


class _BiasBeforeNorm(torch.nn.Module):
    """A conv whose bias feeds a batch norm: the bias's exact gradient is 0, its float32 gradient round-off."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, bias=True)
        self.norm = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.conv(x))).mean((2, 3)))


def test_float32_check_is_per_parameter_so_round_off_on_a_zero_gradient_passes():
    torch.manual_seed(0)
    module, batch = _BiasBeforeNorm(), {"x": torch.randn(4, 3, 12, 12)}
    loss_fn = lambda out: out.square().mean()  # noqa: E731
    ref = gradient_reference(module, batch, loss_fn, atol=0.0)
    assert ref.float32_errors["conv.bias"] > 0, "the float32 bias gradient should be round-off, not exactly 0"
    same = check_gradients(ref, copy.deepcopy(module), batch, loss_fn, rtol=1e-4, atol=0.0)
    assert same["ok"] and same["float32_ratio"] <= 1 / 3 + 1e-9, same
    wrong = copy.deepcopy(module)
    with torch.no_grad():
        wrong.head.weight.mul_(1.01)
    bad = check_gradients(ref, wrong, batch, loss_fn, rtol=1e-4, atol=0.0)
    assert not bad["ok"] and bad["float32_ratio"] > 1, bad
