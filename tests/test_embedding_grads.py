"""The pass scattering a tied embedding's gradient into its weight's other gradient
(``export.embedding_grads``): which sums it folds, which it leaves, in place or not, and that the traced step still
computes eager's loss and gradients exactly on CPU (tokens repeated, so rows are summed several times); the tables
of the functional form a pipeline plans on (``export.functional_sums``) equal its trace's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import TINY_GPT2
import pandas as pd

from trainplan.export.embedding_grad_op import embedding_grad_add, embedding_grad_add_
from trainplan.export.functional_sums import functional_sum_tables
from trainplan.export.tables import graph_tables
from trainplan.export.trace import make_step_fn, trace_training_step
from trainplan.fuse.planned import fused_spec
from trainplan.models import BuiltModel, build_model
from trainplan.schedule.stage_problem import FUSED_OPS

aten = torch.ops.aten
SUM = embedding_grad_add._opoverload
SUMS = (embedding_grad_add_, SUM)  # in place (the default), functional (a pipeline's)


class TiedLM(nn.Module):
    """An embedding read by ``lookups`` token inputs and, transposed, by the output head."""

    def __init__(self, lookups: int, padding_idx: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 8, padding_idx=padding_idx)
        self.mix = nn.Linear(8, 8)
        self.lookups = lookups

    def forward(self, ids: torch.Tensor, ids2: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids) + (self.embed(ids2) if self.lookups == 2 else 0)
        return torch.tanh(self.mix(hidden)) @ self.embed.weight.t()


def _built(module: nn.Module) -> BuiltModel:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 6, (3, 7), generator=gen)  # 21 tokens over 6 rows: every row summed several times
    return BuiltModel("tied", module, {"ids": ids, "ids2": ids.flip(0)}, lambda out: out.square().mean())


@pytest.mark.parametrize("distinct", [7, 40])
def test_the_op_equals_eagers_sum_value_for_value(distinct):
    """7 distinct rows among 300 tokens (each summed ~43 times) and up to 40: eager's ``other + dense table``."""
    gen = torch.Generator().manual_seed(distinct)
    other, grad = torch.randn(40, 8, generator=gen), torch.randn(3, 100, 8, generator=gen)
    indices = torch.randint(0, distinct, (3, 100), generator=gen)
    want = other + aten.embedding_dense_backward(grad, indices, 40, -1, False)
    assert torch.equal(embedding_grad_add(other, grad, indices), want)


def _targets(traced) -> list:
    return [n.target for n in traced.gm.graph.nodes if n.op == "call_function"]


def _assert_eager_step(built: BuiltModel, traced, flat) -> None:
    n = len(traced.param_names)
    step = make_step_fn(built, traced.param_names, traced.buffer_names, traced.batch_names)
    eager = step(*[t.detach().clone().requires_grad_(i < n) for i, t in enumerate(flat)])
    got = traced.gm(*[t.detach() for t in flat])
    assert len(got) == len(eager) == 1 + n
    for a, b in zip(got, eager):
        assert torch.equal(a, b.detach())


@pytest.mark.parametrize("in_place", [True, False])
def test_gpt2s_tied_token_embedding_gradient_is_scattered_into_the_heads(in_place):
    """Tiny GPT-2 with repeated tokens: the token embedding's gradient is one ``embedding_grad_add`` into the head's
    (the position embedding, untied, keeps its ``embedding_dense_backward``): one vocabulary-sized storage in the
    backward in place, two functional, where autograd makes three; loss and gradients as eager's."""
    built = build_model("tiny_gpt2", TINY_GPT2, seed=0)
    built.batch["input_ids"][:, ::2] = 7  # half the tokens on one row
    built.batch["labels"] = built.batch["input_ids"]
    traced, flat = trace_training_step(built, sums_in_place=in_place)
    targets = _targets(traced)
    op, other = SUMS if in_place else SUMS[::-1]
    assert targets.count(op) == 1 and other not in targets
    assert targets.count(aten.embedding_dense_backward.default) == 1
    vocab, width = TINY_GPT2["config"]["vocab_size"], TINY_GPT2["config"]["n_embd"]
    tensors = graph_tables(traced).tensors
    params = tensors.storage[tensors.kind == "parameter"]
    made = tensors[(tensors.storage_bytes == vocab * width * 4) & ~tensors.storage.isin(params)]
    assert made.storage.nunique() == (1 if in_place else 2)
    _assert_eager_step(built, traced, flat)


def test_the_functional_tables_equal_the_functional_trace():
    """What a pipeline plans on (the exported tables made functional) is what its ranks trace, storage ids and
    node names included."""
    built = build_model("tiny_gpt2", TINY_GPT2, seed=0)
    exported = graph_tables(trace_training_step(built)[0])
    traced = graph_tables(trace_training_step(built, sums_in_place=False)[0])
    nodes, tensors = functional_sum_tables(exported.nodes, exported.tensors)
    assert not nodes.equals(exported.nodes)
    pd.testing.assert_frame_equal(nodes, traced.nodes)
    pd.testing.assert_frame_equal(tensors, traced.tensors)


@pytest.mark.parametrize("in_place", [True, False])
def test_an_embedding_read_twice_and_tied_to_the_head_folds_both_sums(in_place):
    traced, flat = trace_training_step(built := _built(TiedLM(lookups=2)), sums_in_place=in_place)
    targets = _targets(traced)
    assert targets.count(SUMS[0 if in_place else 1]) == 2
    assert aten.embedding_dense_backward.default not in targets
    _assert_eager_step(built, traced, flat)


def test_a_padding_row_or_an_untied_embedding_is_left_as_traced():
    """``padding_idx`` set: the sum stays a dense add of the embedding's table (the scatter would write the
    padding row); an embedding whose weight has no other gradient has no sum to fold."""
    traced, flat = trace_training_step(built := _built(TiedLM(lookups=1, padding_idx=2)))
    targets = _targets(traced)
    assert not set(SUMS) & set(targets)
    assert targets.count(aten.embedding_dense_backward.default) == 1
    _assert_eager_step(built, traced, flat)
    untied = build_model("tiny_gpt2", {**TINY_GPT2, "config": {**TINY_GPT2["config"], "tie_word_embeddings": False}})
    assert not set(SUMS) & set(_targets(trace_training_step(untied)[0]))


def test_a_fused_gpt2_keeps_its_embeddings_out_of_fused_ops_so_its_step_folds_the_sum():
    """Tiny GPT-2 with its forward groups fused (fx halves): the embeddings stay ops of the traced step
    (``fuse.planned.UNFUSED_OPS``), so the tied sum is an ``embedding_grad_add`` there too, beside fused ops."""
    spec = fused_spec("tiny_gpt2", TINY_GPT2, {"builtin": "inductor"}, seed=0, max_ops=24, compiler="fx")
    traced, _ = trace_training_step(build_model("tiny_gpt2+inductor", spec, seed=0))
    targets = [str(t) for t in _targets(traced)]
    assert targets.count(str(SUMS[0])) == 1 and targets.count("aten.embedding.default") == 2
    assert any(t.startswith(FUSED_OPS) for t in targets)
