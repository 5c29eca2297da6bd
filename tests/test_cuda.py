"""The executor's CUDA paths: pinned host copies on a side stream, storage accounting against the caching
allocator, and a validation on the GPU. Skipped where no CUDA device is present (as in CI)."""

from __future__ import annotations


import pytest
import torch

from tests.conftest import SMALL_CNN, TINY_GPT2
from tests.test_execute import LOOSE_TIME, mlp, no_recompute, plan_for, swap_and_recompute  # noqa: F401 (fixture)
from trainplan.execute import GraphLayout, ValidateSettings, parse_plan, run_plan, stage_layouts, validate_plan
from trainplan.export.tables import graph_tables
from trainplan.export.trace import trace_training_step
from trainplan.host_swap import HostPool
from trainplan.models import build_model, on_device
from trainplan.numerics import exact_fp32
from trainplan.profile.link import measure_host_link
from trainplan.schedule import replay

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


@pytest.fixture(scope="module", params=[("small_cnn", SMALL_CNN), ("tiny_gpt2", TINY_GPT2)], ids=lambda p: p[0])
def traced_on_cuda(request):
    """A model traced with its weights and batch on the GPU (a CPU trace bakes CPU kernels and devices in)."""
    name, spec = request.param
    traced, flat = trace_training_step(on_device(build_model(name, spec, seed=0), CUDA))
    return traced, flat, graph_tables(traced)


def execute_on_cuda(traced, flat, tables, plan):
    """(stages, the run, the unmodified step's outputs), with fp32 exact and deterministic kernels."""
    stages = parse_plan(plan)
    layout = GraphLayout.build(traced.gm, flat, tables.tensors)
    with exact_fp32():
        result = run_plan(stage_layouts(stages, layout), [s.events for s in stages], layout, traced.gm,
                          device=CUDA, measure=True)
        with torch.no_grad():
            want = list(traced.gm(*[t.detach() for t in flat]))
    return stages, result, want


def test_a_swapped_storage_comes_back_intact_after_its_device_memory_is_reused():
    """The copy out runs on a side stream: the freed source must not be reused before it finishes."""
    pool = HostPool(CUDA)
    src = torch.randn(1 << 22, device=CUDA)
    want = src.clone()
    pool.save(0, src.untyped_storage())
    del src
    clobber = [torch.full((1 << 22,), 7.0, device=CUDA) for _ in range(4)]  # takes freed blocks first
    back = pool.load(0)
    torch.cuda.synchronize()
    got = torch.empty(0, dtype=torch.float32, device=CUDA).set_(back)
    assert torch.equal(got, want) and all(bool((c == 7.0).all()) for c in clobber)
    assert pool.copies[0].data.is_pinned()


def test_a_host_resident_storage_of_a_cuda_step_swaps_on_the_host():
    """Efficient attention returns its philox seed and offset in host memory, even in a CUDA step."""
    pool = HostPool(CUDA)
    src = torch.arange(2, dtype=torch.int64)
    pool.save(0, src.untyped_storage())
    back = pool.load(0)
    assert back.device.type == "cpu" and torch.equal(torch.empty(0, dtype=torch.int64).set_(back), src)


@pytest.mark.parametrize("events_of", [no_recompute, swap_and_recompute])
def test_executed_schedule_on_cuda_gives_the_unmodified_step(traced_on_cuda, events_of):
    traced, flat, tables = traced_on_cuda
    assert all(t.device.type == "cuda" for t in flat)
    stages, result, want = execute_on_cuda(traced, flat, tables, plan_for(tables, [tables.nodes.name.tolist()], events_of))
    assert all(t.device.type == "cuda" for t in result.outputs)
    for got, ref in zip(result.outputs, want):
        assert torch.equal(got, ref)  # same deterministic kernels on the same values
    problem, events = stages[0].problem, stages[0].events
    peak = max(result.records, key=lambda r: r.bytes_peak)
    # every byte beyond the replay's peak is named: an extra kernel output the plan does not hold (on CUDA,
    # nll_loss_forward's 4-byte total_weight)
    assert peak.bytes_peak - sum(peak.unplanned.values()) <= replay(problem, events).peak_bytes <= peak.bytes_peak


def test_validation_on_cuda_measures_the_allocator_and_passes_a_faithful_plan(mlp):
    built, _, _, tables = mlp
    plan = plan_for(tables, [tables.nodes.name.tolist()], swap_and_recompute)
    v = validate_plan(built, plan, parse_plan(plan), tables.tensors, export_names=tables.nodes.name.tolist(),
                      settings=ValidateSettings(repeats=2, warmup=1, device="cuda", tolerances=LOOSE_TIME))
    rep = v.report
    assert rep["status"] == "passed", rep["reasons"]
    st = rep["stages"][0]
    assert st["measured_peak_bytes"] == st["predicted_storage_peak_bytes"] <= st["predicted_peak_bytes"]
    assert rep["memory"]["allocator_method"] == "torch.cuda.max_memory_allocated"
    assert rep["memory"]["peak_bytes_allocator"] >= st["measured_peak_bytes"]
    assert rep["memory"]["counted"] == "peak_bytes_allocator" and rep["memory"]["peak_bytes_process"] is None
    assert rep["memory"]["peak_bytes_host_pinned"] >= st["host_peak_bytes"] > 0  # pinned blocks: powers of two
    assert rep["timing"]["host_link_now"]["bytes_per_s"] > 0


def test_the_host_link_on_cuda_is_timed_on_pinned_copies():
    link = measure_host_link(CUDA, [1 << 24] * 8, repeats=3, warmup=1)
    assert link.tensors == 8 and link.bytes_per_direction == 8 << 24
    assert link.swap_out_s > 0 and link.swap_in_s > 0
    assert 1e8 < link.bytes_per_s < 1e12  # between 0.1 GB/s and 1 TB/s: a PCIe or NVLink-C2C link
