"""The chunked loss head: ``trainplan::linear_cross_entropy`` against PyTorch's cross-entropy, the pass that puts
it in a traced step (tied GPT-2 and an untied Llama head), its refusals, and ``trainplan.plan(loss_chunk=)``
training as eager below the unchunked plan's measured peak."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import trainplan
from tests.conftest import TINY_GPT2
from tests.test_execute import plan_for, reference, swap_and_recompute
from tests.test_execute_compile import assert_same_run, both
from tests.test_plan_api import FAST, token_batches
from trainplan.execute.measure import peak_during
from trainplan.export.loss_head import LossHeadError, chunk_loss_head
from trainplan.export.loss_head_op import MEAN, SUM, linear_cross_entropy
from trainplan.export.tables import graph_tables
from trainplan.export.trace import trace_training_step
from trainplan.errors import ModelSpecError
from trainplan.models import BuiltModel, build_model, check_spec, on_device

TINY_LLAMA = {"source": "transformers", "architecture": "LlamaForCausalLM",
              "config": {"num_hidden_layers": 1, "hidden_size": 48, "intermediate_size": 96, "num_attention_heads": 2,
                         "num_key_value_heads": 1, "vocab_size": 300},
              "inputs": {"batch_size": 3, "seq_len": 10}}


@pytest.mark.parametrize(("reduction", "name"), [(MEAN, "mean"), (SUM, "sum")])
def test_the_op_equals_cross_entropy_and_its_gradients(reduction, name):
    """Rows in chunks of 4 over 13 rows, two rows ignored: loss and both gradients as autograd's."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(13, 8, generator=gen, requires_grad=True)
    weight = torch.randn(30, 8, generator=gen, requires_grad=True)
    target = torch.randint(0, 30, (13,), generator=gen)
    target[[2, 7]] = -100
    want = F.cross_entropy(hidden @ weight.t(), target, reduction=name, ignore_index=-100)
    want.backward()
    loss, grad_hidden, grad_weight = linear_cross_entropy(hidden.detach(), weight.detach(), target, reduction, -100, 4)
    torch.testing.assert_close(loss, want.detach())
    torch.testing.assert_close(grad_hidden, hidden.grad)
    torch.testing.assert_close(grad_weight, weight.grad)
    assert not grad_hidden[[2, 7]].any()


def test_every_row_ignored_gives_nll_losss_nan_and_zero_gradients():
    hidden, weight = torch.randn(5, 4), torch.randn(6, 4)
    target = torch.full((5,), -100)
    loss, grad_hidden, grad_weight = linear_cross_entropy(hidden, weight, target, MEAN, -100, 2)
    assert torch.isnan(loss) and torch.isnan(F.cross_entropy(hidden @ weight.t(), target))
    assert not grad_hidden.any() and not grad_weight.any()


@pytest.mark.parametrize("spec", [TINY_GPT2, TINY_LLAMA], ids=["gpt2_tied", "llama_untied"])
def test_the_pass_replaces_the_head_and_keeps_the_step(spec):
    """The traced step and its rewrite (logits chunks of 7 rows: 32 and 30 rows do not divide) return the
    same loss and gradients; the rewrite has no log-softmax, NLL or vocabulary-sized tensor left."""
    built = build_model("tiny", spec, seed=0)
    traced, flat = trace_training_step(built)
    vocab = built.module.config.vocab_size
    chunked = chunk_loss_head(traced, 7 * vocab * 4)
    targets = [n.target for n in chunked.gm.graph.nodes if n.op == "call_function"]
    assert targets.count(linear_cross_entropy._opoverload) == 1
    assert not {torch.ops.aten._log_softmax.default, torch.ops.aten.nll_loss_forward.default} & set(targets)
    rows = built.batch["input_ids"].numel()
    big = [n.name for n in chunked.gm.graph.nodes if isinstance(v := n.meta.get("val"), torch.Tensor)
           and v.shape[-1:] == (vocab,) and v.numel() == rows * vocab]  # logits-shaped
    assert big == [], big
    head = next(n for n in chunked.gm.graph.nodes if n.target is linear_cross_entropy._opoverload)
    assert head.args[-1] == 7 and chunked.loss_node == next(iter(head.users)).name
    want, got = traced.gm(*flat), chunked.gm(*flat)
    assert len(want) == len(got)
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a)


def test_steps_without_the_head_are_refused_naming_the_model_and_node():
    built = build_model("tiny", TINY_GPT2, seed=0)
    read_twice = BuiltModel("logits_read_twice", built.module, built.batch,
                            lambda out: out.loss + out.logits.mean())
    traced, _ = trace_training_step(read_twice)
    with pytest.raises(LossHeadError, match=r"model 'logits_read_twice': '\w+' is not the step's loss \('add_\d+'\)"):
        chunk_loss_head(traced, 2**20)
    no_labels = {"input_ids": built.batch["input_ids"]}
    mse = BuiltModel("mse", built.module, no_labels, lambda out: out.logits.square().mean())
    traced, _ = trace_training_step(mse)
    with pytest.raises(LossHeadError, match="model 'mse': expected one nll_loss_forward, found 0"):
        chunk_loss_head(traced, 2**20)


def test_a_plan_with_the_chunked_head_trains_as_eager_below_the_unchunked_peak(tmp_path):
    """Tiny GPT-2 at 4 x 32 (logits 128 x 512), AdamW in the plan, budget 1.0: 4 steps of a plain loop give
    eager's losses and parameters within round-off, and the measured peak of a step is at least one
    logits-sized tensor below the same plan made without chunking."""
    spec = {**TINY_GPT2, "inputs": {"batch_size": 4, "seq_len": 32}}
    logits_bytes = 4 * 32 * 512 * 4
    extra = {}
    for chunk in (None, "16KiB"):
        built = build_model("tiny_gpt2", spec, seed=0)
        reference = copy.deepcopy(built.module)
        opt = torch.optim.AdamW(built.module.parameters(), lr=1e-3)
        ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3)
        planned = trainplan.plan(built.module, built.batch, 1.0, cache_dir=tmp_path, optimizer=opt, loss_chunk=chunk,
                                 **FAST)
        for batch in token_batches(4):
            loss = planned(batch)
            loss.backward()
            ref = reference(**batch).loss
            ref.backward()
            for o in (opt, ref_opt):
                o.step()
                o.zero_grad()
            torch.testing.assert_close(loss.detach(), ref.detach())
        for a, b in zip(built.module.parameters(), reference.parameters()):
            torch.testing.assert_close(a, b)
        _, extra[chunk] = peak_during(lambda: planned(built.batch).backward(), torch.device("cpu"))  # noqa: B023
    print(f"measured step peak: {extra[None]} B as traced, {extra['16KiB']} B chunked (logits {logits_bytes} B)")
    assert extra["16KiB"] <= extra[None] - logits_bytes


def test_a_chunk_that_is_not_bytes_is_refused(tmp_path):
    built = build_model("tiny_gpt2", TINY_GPT2, seed=0)
    with pytest.raises(ValueError, match=r"loss_chunk=0.5: give bytes > 0"):
        trainplan.plan(built.module, built.batch, 1.0, cache_dir=tmp_path, loss_chunk=0.5, **FAST)


def test_a_model_entry_with_loss_chunk_is_traced_chunked_everywhere_it_is_built():
    """``models.<name>.loss_chunk`` (the workflow's config): every rule's trace of the model has the op; a
    fraction or a bad unit is refused at the start-up check, naming the model."""
    built = build_model("tiny_gpt2", {**TINY_GPT2, "loss_chunk": "4KiB"}, seed=0)
    assert built.loss_chunk_bytes == 4096
    traced, _ = trace_training_step(on_device(built, "cpu"))
    head = [n for n in traced.gm.graph.nodes if n.target is linear_cross_entropy._opoverload]
    assert len(head) == 1 and head[0].args[-1] == 4096 // (512 * 4)
    for bad in ("0.5", "4 parsecs"):
        with pytest.raises(ModelSpecError, match="model 'tiny_gpt2': loss_chunk"):
            check_spec("tiny_gpt2", {**TINY_GPT2, "loss_chunk": bad})


@pytest.mark.parametrize("spec", [TINY_GPT2, TINY_LLAMA], ids=["gpt2_tied", "llama_untied"])
def test_views_of_the_ops_gradients_alias_them_and_a_compiled_plan_runs_as_the_interpreter(spec):
    """The rewrite's fake values are propagated again: the transposes and views reading the op's gradient
    outputs are views in the tables (they allocated a storage of their own before, so the interpreter and the
    compiled plan held the weight gradient at different events), and a plan with swaps and recomputes on the
    chunked step runs compiled exactly as the interpreter runs it."""
    built = build_model("tiny", {**spec, "loss_chunk": "4KiB"}, seed=0)
    traced, flat = trace_training_step(built)
    tables = graph_tables(traced)
    head = next(n for n in traced.gm.graph.nodes if n.target is linear_cross_entropy._opoverload)
    readers = [u for g in head.users for u in g.users if u.target in (torch.ops.aten.t.default,
                                                                        torch.ops.aten.view.default)]
    assert readers
    views = tables.nodes.set_index("name").loc[[r.name for r in readers]]
    assert views.is_view.all() and (views.alloc_bytes == 0).all(), views[["op", "is_view", "alloc_bytes"]]
    plan = plan_for(tables, [tables.nodes.name.tolist()], swap_and_recompute)
    interpreted, _, outputs, probe = both(traced, flat, tables, plan)
    assert_same_run(interpreted, outputs, probe, reference(traced, flat))
