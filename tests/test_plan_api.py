"""trainplan.plan: one call plans a model's step; the module it returns trains as eager autograd does, in a
plain loop and under Hugging Face's Trainer, within its budget; plans come back from the cache without
profiling or solving."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import transformers

import trainplan
from tests.conftest import SMALL_CNN, TINY_GPT2
from trainplan.budget import format_bytes, parse_budget
from trainplan.execute.measure import peak_during
from trainplan.export.tables import graph_tables
from trainplan.loop import InfeasibleBudgetError, NewBatchShapeError, StepOutput
from trainplan.loop import planner
from trainplan.memory_model import allocation_bytes
from trainplan.models import build_model

REPO = Path(__file__).resolve().parents[1]
# Tiny GPT-2 on 4 x 32 tokens: activations dominate the step. At the fixture's 2 x 16 the peak is the gradients'
# at the end of backward, which no recompute lowers: without swaps (the CPU default) 0.6 is not reachable there.
TINY = {**TINY_GPT2, "inputs": {"batch_size": 4, "seq_len": 32}}
FAST = {"time_limit_s": 4.0, "progress": False}  # the solver's limit, with room on a busy 2-core host


def tiny_gpt2():
    return build_model("tiny_gpt2", TINY, seed=0)


def token_batches(n: int, batch_size: int = 4, seq_len: int = 32, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 512, (batch_size, seq_len), generator=gen)
        out.append({"input_ids": ids, "labels": ids.clone()})
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A plan cache holding tiny GPT-2's plan at 0.6 (made once; the tests below read it back)."""
    path = tmp_path_factory.mktemp("plans")
    built = tiny_gpt2()
    made = trainplan.plan(built.module, built.batch, 0.6, cache_dir=path, **FAST)
    assert not made.report.cache_hit and made.report.status == "met"
    return path


def planned_gpt2(cache: Path, **options):
    """A fresh tiny GPT-2 (seed 0), a deep copy to train eagerly beside it, and its plan at 0.6 from ``cache``."""
    built = tiny_gpt2()
    reference = copy.deepcopy(built.module)
    return trainplan.plan(built.module, built.batch, 0.6, cache_dir=cache, **{**FAST, **options}), reference


def test_five_adamw_steps_equal_eager_training_bit_for_bit(cache):
    planned, reference = planned_gpt2(cache)
    assert planned.report.cache_hit and planned.report.status == "met"
    assert planned.step.stages[0].schedule["recomputes"] > 0  # the plan really recomputes
    assert all(a is b for a, b in zip(planned.parameters(), planned.model.parameters()))
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (planned, reference)]
    curve = []
    for batch in token_batches(5):
        loss = planned(batch)
        loss.backward()
        ref = reference(**batch).loss
        ref.backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
        curve.append((loss.item(), ref.item()))
        assert torch.equal(loss.detach(), ref.detach()), curve
    for a, b in zip(planned.model.parameters(), reference.parameters()):
        assert torch.equal(a, b)


def test_gradients_land_in_grad_accumulate_and_scale_as_autograds(cache):
    """One backward, a second without zero_grad (accumulated), then a loss scaled by 0.25 (a power of two:
    scaling the gradients after the step is exact, as scaling the upstream gradient inside backward is)."""
    planned, reference = planned_gpt2(cache)
    first, second = token_batches(2)
    for batch, scale in ((first, 1.0), (second, 1.0), (first, 0.25)):
        (planned(batch) * scale).backward()
        (reference(**batch).loss * scale).backward()
        for (name, a), b in zip(planned.model.named_parameters(), reference.parameters()):
            assert torch.equal(a.grad, b.grad), (name, scale)


def test_a_second_call_reads_the_cache_without_profiling_or_solving(cache, monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("a cached plan was profiled or solved again")

    monkeypatch.setattr(planner, "profile_nodes", refuse)
    monkeypatch.setattr(planner, "plan_stage", refuse)
    start = time.perf_counter()
    planned, _ = planned_gpt2(cache)
    took = time.perf_counter() - start
    assert planned.report.cache_hit and planned.report.cache_path.parent == cache
    assert 0 < planned.report.trace_s < planned.report.plan_s, planned.report  # tracing, then compiling
    print(f"cached plan() of tiny GPT-2: {planned.report.plan_s:.2f} s (with building the model: {took:.2f} s)")


def test_a_new_process_reads_the_cache(cache):
    code = ("import sys; sys.path.insert(0, 'tests'); import trainplan; from test_plan_api import tiny_gpt2, FAST; "
            "b = tiny_gpt2(); p = trainplan.plan(b.module, b.batch, 0.6, cache_dir=sys.argv[1], **FAST); "
            "print(p.report.cache_hit, p.report.plan_s)")
    done = subprocess.run([sys.executable, "-c", code, str(cache)], capture_output=True, text=True, cwd=REPO)
    hit, seconds = done.stdout.split()[-2:]
    assert hit == "True", done.stderr[-2000:]
    assert float(seconds) < 3.0
    print(f"cached plan() of tiny GPT-2 in a new process: {float(seconds):.2f} s")


def test_a_new_batch_shape_is_planned_for_or_refused(cache):
    planned, reference = planned_gpt2(cache, on_infeasible="raise_budget")  # 0.6 of 2 x 32 is near its least
    first_plan = planned.report.cache_path
    short = token_batches(1, batch_size=2, seq_len=32)[0]
    loss = planned(short)
    assert not planned.report.cache_hit and planned.report.cache_path != first_plan
    assert torch.equal(loss.detach(), reference(**short).loss.detach())
    planned(token_batches(1)[0])
    assert planned.report.cache_path == first_plan  # the first shape's plan, kept
    strict, _ = planned_gpt2(cache, on_new_shape="raise")
    with pytest.raises(NewBatchShapeError, match=r"batch key 'input_ids': shape \(2, 32\) torch.int64 on cpu, the "
                                                 r"plan was made for shape \(4, 32\) torch.int64 on cpu"):
        strict(short)


def test_a_budget_below_any_schedule_is_named_or_raised_if_allowed(cache, capfd):
    """1 MB is below the memory floor of the step: the error names both budgets and that it is proven; with
    raise_budget the same cached plan trains at the least budget reached, and the report says so."""
    built = tiny_gpt2()
    with pytest.raises(InfeasibleBudgetError) as err:
        trainplan.plan(built.module, built.batch, "1MB", cache_dir=cache, time_limit_s=FAST["time_limit_s"])
    said = str(err.value)
    assert said.startswith("budget 1000000 B (976.56 KiB) is met by no schedule of this step: it is proven infeasible")
    bars = capfd.readouterr().err
    assert all(f"{phase} GPT2LMHeadModel" in bars for phase in ("trace", "profile", "solve"))
    raised = trainplan.plan(built.module, built.batch, "1MB", cache_dir=cache, on_infeasible="raise_budget", **FAST)
    report = raised.report
    assert report.cache_hit and report.status == "proven_infeasible"
    assert report.requested_budget_bytes == 1_000_000 < report.floor_bytes <= report.planned_budget_bytes
    assert f"The least budget reached is {format_bytes(report.planned_budget_bytes)} ({report.planned_budget_bytes} B;" in said
    assert report.predicted_peak_bytes <= report.planned_budget_bytes < report.no_recompute_peak_bytes
    assert capfd.readouterr().err == ""  # progress=False: no bars


def test_batch_norm_statistics_update_in_place_as_eagers():
    """small_cnn: planning leaves the running statistics as they were; each planned step updates them as an
    eager step does."""
    built = build_model("small_cnn", SMALL_CNN, seed=0)
    reference = copy.deepcopy(built.module)
    with tempfile.TemporaryDirectory() as cache_dir:
        planned = trainplan.plan(built.module, built.batch, 0.8, cache_dir=cache_dir, **FAST)
    assert planned.step.stages[0].schedule["recomputes"] > 0
    for a, b in zip(built.module.buffers(), reference.buffers()):
        assert torch.equal(a, b)
    for _ in range(2):
        loss = planned(built.batch)
        loss.backward()
        ref = reference(**built.batch)
        ref.backward()
        assert torch.equal(loss.detach(), ref.detach())
        for a, b in zip(built.module.parameters(), reference.parameters()):
            assert torch.equal(a.grad, b.grad)
        for a, b in zip(built.module.buffers(), reference.buffers()):
            assert torch.equal(a, b)


def test_dropout_draws_as_eager_and_planning_leaves_the_random_stream_alone():
    """With dropout on, a planned step under a seed equals an eager step under that seed (the plan never
    recomputes a random op), and plan() (which profiles the step) leaves the caller's random stream as it was."""
    built = build_model("tiny_gpt2", {**TINY, "dropout": True}, seed=0)
    reference = copy.deepcopy(built.module)
    torch.manual_seed(7)
    with tempfile.TemporaryDirectory() as cache_dir:
        planned = trainplan.plan(built.module, built.batch, 0.6, cache_dir=cache_dir, **FAST)
    after_plan = torch.rand(1)
    torch.manual_seed(7)
    assert torch.equal(after_plan, torch.rand(1))
    for seed in (0, 1):
        torch.manual_seed(seed)
        loss = planned(built.batch)
        loss.backward()
        torch.manual_seed(seed)
        ref = reference(**built.batch).loss
        ref.backward()
        assert torch.equal(loss.detach(), ref.detach())
        for a, b in zip(built.module.parameters(), reference.parameters()):
            assert torch.equal(a.grad, b.grad)


def test_eval_mode_runs_the_model_itself(cache):
    planned, reference = planned_gpt2(cache)
    batch = token_batches(1)[0]
    planned.eval()
    assert not planned.model.training
    with torch.no_grad():
        out = planned(batch)
        assert torch.equal(out.logits, reference.eval()(**batch).logits)
    planned.train()
    assert planned.model.training and isinstance(planned(**batch), StepOutput)


def test_the_measured_peak_of_a_planned_step_is_within_its_budget(cache):
    """The allocator's peak (the profiler's memory events) of forward and backward of the planned module, on top
    of the parameters, buffers and batch it starts from: within the plan's budget at 0.6 (no swaps on the CPU)."""
    planned, _ = planned_gpt2(cache)
    batch = token_batches(1)[0]
    flat = planned.step.flat(dict(planned.model.named_parameters()), batch)
    start = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in flat}.values())
    _, extra = peak_during(lambda: planned(batch).backward(), torch.device("cpu"))
    report = planned.report
    assert planned.step.stages[0].schedule["swap_outs"] == 0
    assert extra is not None and start + extra <= report.planned_budget_bytes, (start + extra, report)
    print(f"measured peak {start + extra} B, planned budget {report.planned_budget_bytes} B, "
          f"predicted {report.predicted_peak_bytes} B, no recompute {report.no_recompute_peak_bytes} B")


def test_the_plan_counts_each_storage_as_the_process_meter_holds_it(cache):
    """Every op of the plan's problem weighs its storages at their allocation sizes on the CPU (whole pages from
    64 KiB, heap padding and the tensor's objects below: ``memory_model.allocation_bytes``), not their data bytes."""
    planned, _ = planned_gpt2(cache)
    tensors = graph_tables(planned.step.traced).tensors
    size = dict(zip(tensors.storage, tensors.storage_bytes))
    ops = [op for op in planned.step.stages[0].raw["ops"] if op["storages"]]
    assert ops and all(op["bytes"] == sum(allocation_bytes("cpu", int(size[s])) for s in op["storages"]) for op in ops)
    assert sum(op["bytes"] for op in ops) > sum(int(size[s]) for op in ops for s in op["storages"]) + 400 * len(ops)


def test_hugging_face_trainer_trains_the_planned_module_as_the_model(cache):
    """2 Trainer steps with the planned module log the losses of 2 steps with the model itself. The eager model
    is told not to take loss kwargs, as the planned module does not: Trainer then averages the loss over the
    batch as the model does (with them it passes num_items_in_batch, and GPT-2 divides by that count)."""
    planned, reference = planned_gpt2(cache)
    reference.accepts_loss_kwargs = False
    rows = [{"input_ids": b["input_ids"][0], "labels": b["labels"][0]} for b in token_batches(8, batch_size=1)]

    class Losses(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.seen: list[float] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.seen.append(logs["loss"])

    def train(model) -> list[float]:
        losses = Losses()
        with tempfile.TemporaryDirectory() as out:
            args = transformers.TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=2,
                                                  logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                                                  seed=0, disable_tqdm=True)
            transformers.Trainer(model=model, args=args, train_dataset=rows, callbacks=[losses]).train()
        return losses.seen

    planned_losses, eager_losses = train(planned), train(reference)
    assert len(planned_losses) == 2 and planned_losses == eager_losses


@pytest.mark.parametrize("example, steps", [("plan_in_loop.py", ["step 0", "step 1"]),
                                            ("plan_with_trainer.py", ["step 1", "step 2"])])
def test_the_examples_run(cache, example, steps):
    """The plain loop and Trainer (the optimizer in the plan) each print the plan, then each step's measured peak."""
    env = {**os.environ, "TRAINPLAN_PLAN_CACHE": str(cache)}
    done = subprocess.run([sys.executable, f"examples/{example}", "--tiny", "--steps", "2", "--budget", "0.6",
                           "--time-limit", "4"], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("plan: budget")
    assert [line.split(":")[0] for line in lines if " measured peak " in line] == steps


def test_importing_trainplan_stays_free_of_torch_until_plan_is_used():
    code = "import sys, trainplan; print('torch' in sys.modules); trainplan.plan; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True"]


def test_byte_budgets_a_byte_apart_key_different_plans(tiny_gpt2):
    """The cache key holds a byte budget exactly (not its rounded label: 1000000 B and 1000001 B both read
    976.56 KiB), and tells a fraction from bytes."""
    built, traced, _, _ = tiny_gpt2
    base = planner.PlanSettings(parse_budget(1_000_000), built.loss_fn, 1.0, 1, 0, None, 1, "raise", Path("."), False)
    keys = {planner.plan_key(planner._key_fields(traced, built.batch, torch.device("cpu"),
                                                 dataclasses.replace(base, budget=parse_budget(b))))[0]
            for b in (1_000_000, 1_000_001, "1000000", 0.5)}
    assert len(keys) == 3  # 1000000 and "1000000" are the same budget


def test_plans_made_by_other_trainplan_code_are_keyed_apart(tiny_gpt2, monkeypatch):
    """The key holds a digest of the package's source: an edit of it (a new planner) keys a new plan, so a
    cached plan is never reused by code that would make another; the same code keys the same plan."""
    built, traced, _, _ = tiny_gpt2
    settings = planner.PlanSettings(parse_budget(0.5), built.loss_fn, 1.0, 1, 0, None, 1, "raise", Path("."), False)

    def key() -> str:
        return planner.plan_key(planner._key_fields(traced, built.batch, torch.device("cpu"), settings))[0]

    first = key()
    assert key() == first and len(planner.package_digest()) == 16
    monkeypatch.setattr(planner, "package_digest", lambda: "0" * 16)
    assert key() != first
