"""Speed of ops on aligned shapes: what each time covers, per-call clock, and the step's values left alone."""

from __future__ import annotations

import time

import pytest
import torch

from trainplan.align.classes import OpSpec, build_problem, resolve
from trainplan.align.execute import run_padded
from trainplan.align.problem import solve
from trainplan.align.speed import OpClock, op_speed

H = torch.float16


def _mm_problem(m: int, k: int, n: int, q: int):
    spec = OpSpec("t", "aten.mm.default", "float16", {"self": (m, k), "mat2": (k, n)}, {"out0": (m, n)}, {})
    problem = build_problem(spec)
    return problem, solve(problem, q).padded


def test_the_clock_counts_one_call_of_back_to_back_runs():
    calls = []
    t = OpClock(repeats=3, warmup=2, calls=4).time(lambda: (calls.append(1), time.sleep(0.002)), torch.device("cpu"))
    assert len(calls) == 2 + 3 * 4
    assert 0.002 <= t < 0.02


def test_bad_clock_settings_are_refused():
    with pytest.raises(ValueError, match="repeats"):
        OpClock(repeats=0)


def test_aligned_time_is_the_op_on_the_padded_shapes_alone():
    """The kernel timed as 'aligned' receives the padded tensors; the padded run is the same op with the padding."""
    problem, padded = _mm_problem(5, 7, 24, q=8)  # [5, 7] x [7, 24]: K padded to 8 costs the fewest elements
    assert padded == {"K": 8}
    seen = []

    def spy(fn, kwargs):
        seen.append({k: tuple(v.shape) for k, v in kwargs.items() if isinstance(v, torch.Tensor)})
        return fn(**kwargs)

    gen = torch.Generator().manual_seed(0)
    bound = {"self": torch.randn(5, 7, generator=gen).to(H), "mat2": torch.randn(7, 24, generator=gen).to(H)}
    run_padded(resolve("aten.mm.default", ""), bound, problem, padded, [(5, 24)], call=spy)
    assert seen == [{"self": (5, 8), "mat2": (8, 24)}]
    t = op_speed(resolve("aten.mm.default", ""), bound, problem, padded, [(5, 24)], OpClock(repeats=3, warmup=1))
    assert t.plain_s > 0 and t.aligned_s > 0
    # the padded run does the aligned computation plus two copies: never cheaper than a tenth of it (noise margin)
    assert t.padded_run_s > 0.1 * t.aligned_s


def test_an_in_place_op_is_timed_on_copies_of_the_step_values():
    problem = build_problem(OpSpec("t", "aten.add_.Tensor", "float16", {"self": (3, 5), "other": (3, 5)}, {"out0": (3, 5)}, {}))
    padded = solve(problem, 8).padded
    assert padded, "15 elements at q = 8 need a flat pad"
    x, y = torch.ones(3, 5, dtype=H), torch.ones(3, 5, dtype=H)
    op_speed(resolve("aten.add_.Tensor", ""), {"self": x, "other": y}, problem, padded, [(3, 5)], OpClock(repeats=2, warmup=1))
    assert torch.equal(x, torch.ones(3, 5, dtype=H)), "the step's own tensor was written by the timing runs"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_times_wait_for_the_device():
    """A large fp16 matmul on the GPU takes far longer than its launch: an unsynchronised clock would read ~launch."""
    problem, padded = _mm_problem(4097, 4096, 4096, q=8)
    bound = {"self": torch.randn(4097, 4096, device="cuda").half(), "mat2": torch.randn(4096, 4096, device="cuda").half()}
    t = op_speed(resolve("aten.mm.default", ""), bound, problem, padded, [(4097, 4096)], OpClock(repeats=3, warmup=2))
    flops = 2 * 4097 * 4096 * 4096
    assert flops / t.plain_s < 2.0e15, "faster than any GPU's fp16 peak: the clock did not wait for the kernel"
