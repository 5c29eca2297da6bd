"""A plan exported as selective activation checkpointing (trainplan.loop.sac): the model trains as eager does,
backward reruns the calls the plan recomputes and no call the policy saves, the step's measured peak falls
below eager's, torch.compile honours it, and exports that cannot be right are refused."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, set_checkpoint_early_stop

import trainplan
from tests.conftest import TINY_GPT2
from trainplan.execute.measure import peak_during
from trainplan.loop.sac import SacExportError, block_regions, sac_policy
from trainplan.models import build_model

TINY = {**TINY_GPT2, "inputs": {"batch_size": 4, "seq_len": 32}}  # activations dominate: 0.6 recomputes
FAST = {"time_limit_s": 4.0, "progress": False}


class _Calls(TorchDispatchMode):
    """Aten calls made while active, by name (detach left out: autograd adds those)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is not torch.ops.aten.detach.default:
            self.calls[str(func)] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """Tiny GPT-2's plan at 0.6 of its no-recompute peak, the model, its batch and an untouched copy."""
    built = build_model("tiny_gpt2", TINY, seed=0)
    reference = copy.deepcopy(built.module)
    plan = trainplan.plan(built.module, built.batch, 0.6, cache_dir=tmp_path_factory.mktemp("plans"), **FAST)
    assert plan.report.status == "met"
    return plan, built, reference


def _calls(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[Counter[str], Counter[str]]:
    """The aten calls of one step's forward and of its backward."""
    with _Calls() as forward:
        loss = model(**batch).loss
    with _Calls() as backward:
        loss.backward()
    return forward.calls, backward.calls


def _backward_calls(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> Counter[str]:
    return _calls(model, batch)[1]


def test_export_trains_as_eager(planned) -> None:
    plan, built, reference = planned
    model, eager = copy.deepcopy(reference), copy.deepcopy(reference)
    export = sac_policy(plan)
    assert list(export.regions) == block_regions(model) == ["transformer.h.0", "transformer.h.1"]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, eager)]
    with export.applied(model):
        for _ in range(3):
            losses = []
            for m, opt in zip((model, eager), opts):
                loss = m(**built.batch).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach())
            assert torch.equal(losses[0], losses[1])
    for (name, a), b in zip(model.named_parameters(), eager.parameters()):
        assert torch.equal(a, b), name


def test_backward_reruns_what_the_plan_recomputes(planned) -> None:
    """Without early stop (recompute runs each region's whole forward), backward reruns exactly the calls the
    policy does not save; with it (PyTorch's default), only a part of them, stopping once the tensors backward
    needs are back (a recomputed call after the last needed one is not rerun)."""
    plan, built, reference = planned
    export = sac_policy(plan)
    forward, eager = _calls(copy.deepcopy(reference), built.batch)
    recomputed, not_saved = Counter(), Counter()
    for region in export.regions.values():
        for func, policies in region.calls.items():
            if str(func) not in forward:
                continue  # traced but never called eagerly: make_fx's aten.scalar_tensor for a Python scalar
            recomputed[str(func)] += policies.count(CheckpointPolicy.MUST_RECOMPUTE)
            not_saved[str(func)] += sum(p != CheckpointPolicy.MUST_SAVE for p in policies)
    assert sum(recomputed.values()) >= 10  # the plan at 0.6 recomputes each block's MLP input and GELU
    model = copy.deepcopy(reference)
    with export.applied(model), set_checkpoint_early_stop(False):
        rerun = _backward_calls(model, built.batch) - eager
    assert rerun == +not_saved, "backward's reruns differ from the calls the policy does not save"
    model = copy.deepcopy(reference)
    with export.applied(model):
        rerun = _backward_calls(model, built.batch) - eager
    assert sum(rerun.values()) > 0 and not rerun - not_saved, "backward reran a call the policy saves"


def test_export_lowers_the_measured_peak(planned) -> None:
    plan, built, reference = planned
    cpu = torch.device("cpu")

    def step(m: torch.nn.Module):
        return lambda: m(**built.batch).loss.backward()

    _, eager = peak_during(step(copy.deepcopy(reference)), cpu)
    model = copy.deepcopy(reference)
    with sac_policy(plan).applied(model):
        _, exported = peak_during(step(model), cpu)
    assert eager and exported and exported < 0.85 * eager, (exported, eager)


def test_compile_honours_the_export(planned) -> None:
    plan, built, reference = planned
    export = sac_policy(plan)
    model, eager = copy.deepcopy(reference), copy.deepcopy(reference)
    export.apply(model, strict=False)
    compiled = torch.compile(model, backend="aot_eager_decomp_partition")
    got = compiled(**built.batch).loss
    got.backward()
    want = eager(**built.batch).loss
    want.backward()
    torch.testing.assert_close(got, want)
    for a, b in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)
    assert set(export.summary()["unmatched"]) <= {"aten.clone.default"}  # dropout's clone, traced after decomposition


def test_regions_without_recomputes_are_left_to_autograd(planned, tmp_path) -> None:
    plan, built, reference = planned
    whole = trainplan.plan(copy.deepcopy(reference), built.batch, 1.0, cache_dir=tmp_path, **FAST)
    assert not any(c > 1 for c in Counter(o for k, o in whole.step.stages[0].events if k == "compute").values())
    assert sac_policy(whole).regions == {}


def test_refusals(planned, tmp_path) -> None:
    plan, built, reference = planned
    with pytest.raises(SacExportError, match="not submodules"):
        sac_policy(plan, regions=["transformer.h.9"])
    other = build_model("tiny_gpt2", {**TINY, "config": {**TINY["config"], "activation_function": "relu"}}, seed=0)
    with sac_policy(plan).applied(other.module), pytest.raises(SacExportError, match="transformer.h.0.*not in the traced"):
        other.module(**built.batch).loss.backward()
    model = copy.deepcopy(reference)
    with_optimizer = trainplan.plan(model, built.batch, 0.6, cache_dir=tmp_path,
                                    optimizer=torch.optim.SGD(model.parameters(), lr=0.1), **FAST)
    with pytest.raises(SacExportError, match="optimizer"):
        sac_policy(with_optimizer)
