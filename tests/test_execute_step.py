"""load_step: a plan compiled into a training step a user calls with parameters and a batch."""

from __future__ import annotations

import copy

import pytest
import torch

import trainplan
from tests.conftest import SMALL_CNN
from tests.test_execute import plan_for, swap_and_recompute
from trainplan.execute import PlanError
from trainplan.io import write_json
from trainplan.models import build_model


def test_a_loaded_step_trains_as_the_unplanned_step(small_cnn, tmp_path):
    """small_cnn has batch norm: the step also updates the model's running statistics in place."""
    _, traced, _, tables = small_cnn
    write_json(tmp_path / "plan.json", plan_for(tables, [tables.nodes.name.tolist()], swap_and_recompute))
    built = build_model("small_cnn", SMALL_CNN, seed=0)
    reference = copy.deepcopy(built.module)
    step = trainplan.load_step(tmp_path, built.module, built.batch)
    assert any(n.target is trainplan.execute.compile.swap_in for n in step.compiled.module.graph.nodes)
    for _ in range(2):
        loss, grads = step(dict(built.module.named_parameters()), built.batch)
        ref = built.loss_fn(reference(**built.batch))
        ref_grads = torch.autograd.grad(ref, list(reference.parameters()))
        torch.testing.assert_close(loss, ref.detach())
        for (name, _), g in zip(reference.named_parameters(), ref_grads):
            torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-6)
        for a, b in zip(built.module.buffers(), reference.buffers()):
            torch.testing.assert_close(a, b)  # running statistics updated alike
        with torch.no_grad():
            for m, g in ((built.module, [grads[n] for n, _ in built.module.named_parameters()]), (reference, ref_grads)):
                for p, gp in zip(m.parameters(), g):
                    p -= 0.1 * gp


def test_a_plan_for_another_batch_shape_is_refused_by_name(small_cnn, tmp_path):
    _, _, _, tables = small_cnn
    write_json(tmp_path / "plan.json", plan_for(tables, [tables.nodes.name.tolist()], swap_and_recompute))
    built = build_model("small_cnn", SMALL_CNN, seed=0)
    bigger = {k: torch.cat([v, v]) for k, v in built.batch.items()}
    with pytest.raises(PlanError, match="plan.json: stage 0 op '.*' holds"):
        trainplan.load_step(tmp_path, built.module, bigger)
