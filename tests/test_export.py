"""Export: the traced graph is the real training step, and its tables are consistent."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from tests.conftest import TINY_GPT2
from trainplan.aten_ops import is_inplace
from trainplan.export.tables import graph_tables, memory_table
from trainplan.export.trace import TraceError, trace_training_step
from trainplan.models import BuiltModel, ModelSpecError, build_model, check_spec, default_loss, on_device


def _eager_grads(built) -> tuple[torch.Tensor, list[torch.Tensor]]:
    built.module.zero_grad()
    loss = built.loss_fn(built.module(**built.batch))
    loss.backward()
    return loss.detach(), [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in built.module.parameters()]


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "small_cnn"])
def test_traced_step_reproduces_eager_loss_and_gradients(fixture, request):
    built, traced, flat, _ = request.getfixturevalue(fixture)
    # BatchNorm updates running stats in place: run the graph on copies so eager sees the same buffers.
    out = traced.gm(*[t.detach().clone() for t in flat])
    loss, grads = _eager_grads(built)
    torch.testing.assert_close(out[0], loss)
    assert len(out) - 1 == len(grads)
    for got, want in zip(out[1:], grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_tables_are_consistent(tiny_gpt2):
    _, traced, _, tables = tiny_gpt2
    nodes, tensors = tables.nodes, tables.tensors
    assert nodes.node_id.tolist() == list(range(len(nodes)))
    assert set(nodes.phase) == {"forward", "backward"}
    loss_pos = nodes.index[nodes.name == traced.loss_node][0]
    assert (nodes.phase.iloc[: loss_pos + 1] == "forward").all()
    assert (nodes.phase.iloc[loss_pos + 1 :] == "backward").all()
    known = set(tensors.tensor_id)
    assert all(t in known for ins in nodes.inputs for t in ins)
    # One gradient per parameter, all marked as graph outputs and of kind gradient.
    outs = tensors[tensors.is_graph_output]
    assert len(outs) == len(traced.param_names) + 1
    assert (outs.kind != "parameter").all()
    # A matmul's FLOPs follow 2*m*n*k from its shapes.
    mm = nodes[nodes.op == "aten.mm.default"].iloc[0]
    shape_of = tensors.set_index("tensor_id")["shape"]
    shapes = [json.loads(shape_of[t]) for t in mm.inputs]
    assert mm.flops == 2 * shapes[0][0] * shapes[0][1] * shapes[1][1]
    # Forward ops carry the module path recorded while tracing.
    fwd_modules = set(nodes.loc[nodes.phase == "forward", "module"])
    assert any(m.startswith("transformer.h.1.") for m in fwd_modules)


def test_memory_timeline_matches_independent_tracker(small_cnn):
    """Static liveness of the exported graph equals the peak of real storages held while the graph runs."""
    _, traced, flat, tables = small_cnn
    mem, summary = memory_table(tables)
    inputs = [t.detach().clone() for t in flat]
    fixed = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in inputs}
    live: dict[int, int] = {}
    peak = 0

    class Tracker(torch.fx.Interpreter):
        def run_node(self, n):
            nonlocal peak
            out = super().run_node(n)
            values = [v for v in self.env.values() if isinstance(v, torch.Tensor)]
            values += [out] if isinstance(out, torch.Tensor) else [v for v in (out if isinstance(out, tuple) else ()) if isinstance(v, torch.Tensor)]
            live.clear()
            for v in values:
                ptr = v.untyped_storage().data_ptr()
                if ptr not in fixed:
                    live[ptr] = v.untyped_storage().nbytes()
            peak = max(peak, sum(live.values()))
            return out

    Tracker(traced.gm).run(*inputs)
    assert summary["fixed_bytes"] == sum(fixed.values())
    assert summary["activation_peak_bytes"] == peak


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_the_trace_bakes_in_the_device_the_model_is_on(device):
    """Factory ops keep the device they were traced on (GPT-2's position ids: ``arange(..., device=...)``),
    so a graph traced on the CPU cannot run on CUDA: each device type gets its own export."""
    traced, flat = trace_training_step(on_device(build_model("tiny_gpt2", TINY_GPT2, seed=0), device))
    baked = {torch.device(n.kwargs["device"]).type for n in traced.gm.graph.nodes
             if n.op == "call_function" and n.kwargs.get("device") is not None}
    assert baked == {device}
    assert {t.device.type for t in flat} == {device}


def test_is_inplace():
    assert is_inplace("aten.add_.Tensor")
    assert not is_inplace("aten.add.Tensor")
    assert not is_inplace("aten._to_copy.default")


def test_unknown_architecture_names_model_and_class():
    with pytest.raises(ModelSpecError, match=r"model 'm'.*'NoSuchModel'"):
        build_model("m", {"architecture": "NoSuchModel"})


def test_a_misspelled_config_or_kwargs_key_is_refused_with_the_closest_name():
    """Config classes keep any keyword: a typo would silently build the reference size (GPT-2's 12 layers)."""
    typo = {**TINY_GPT2, "config": {**TINY_GPT2["config"], "n_layr": 2}}
    with pytest.raises(ModelSpecError, match=r"model 'm': config key 'n_layr' is not an option of GPT2Config "
                                             r"\(did you mean 'n_layer'\?\)"):
        build_model("m", typo)
    with pytest.raises(ModelSpecError, match=r"model 'c': kwargs key 'chanels' .* trainplan.zoo:small_cnn .*'channels'"):
        build_model("c", {"source": "callable", "callable": "trainplan.zoo:small_cnn", "kwargs": {"chanels": 4}})
    # aliases, properties and keys the config consumes pass, and take effect
    alias = {**TINY_GPT2, "config": {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
                                     "vocab_size": 64, "num_labels": 3, "attn_implementation": "eager"}}
    cfg = build_model("a", alias).module.config
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.num_labels) == (1, 32, 2, 3)
    check_spec("t5", {"architecture": "T5ForConditionalGeneration", "config": {"decoder_start_token_id": 0}})


def test_untraceable_model_names_model_and_op():
    class DataDependent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))

        def forward(self, x):
            h = x * self.w
            return h.sum() if h.sum().item() > 0 else -h.sum()  # Python branch on a tensor value

    built = BuiltModel("dyn", DataDependent(), {"x": torch.randn(4)}, default_loss)
    with pytest.raises(TraceError, match=r"(?s)model 'dyn': tracing failed at op '[\w.]+'.*data-dependent.*test_export.py:\d+"):
        trace_training_step(built)


def test_tables_roundtrip_parquet(tmp_path, tiny_gpt2):
    _, _, _, tables = tiny_gpt2
    tables.nodes.to_parquet(tmp_path / "n.parquet")
    back = pd.read_parquet(tmp_path / "n.parquet")
    assert list(back.inputs.iloc[5]) == list(tables.nodes.inputs.iloc[5])


TINY_DISTILBERT = {
    "source": "transformers",
    "architecture": "DistilBertForMaskedLM",
    "config": {"n_layers": 2, "dim": 64, "hidden_dim": 128, "n_heads": 4, "vocab_size": 512, "max_position_embeddings": 64},
    "inputs": {"batch_size": 2, "seq_len": 16},
}


@pytest.mark.parametrize("spec", [TINY_GPT2, TINY_DISTILBERT], ids=["gpt2", "distilbert"])
def test_backward_matmuls_carry_the_module_of_the_forward_matmul(spec):
    """Every linear layer's backward has its two matmuls (input and weight gradient) attributed to that layer,
    none to the loss function (which is where inheriting from the first input put all of them)."""
    traced, _ = trace_training_step(build_model("m", spec, seed=0))
    nodes = graph_tables(traced).nodes
    fwd, bwd = nodes[nodes.phase == "forward"], nodes[nodes.phase == "backward"]
    matmul = r"aten\.(?:mm|addmm|bmm)\."
    fwd_mm = fwd[fwd.op.str.contains(matmul)]
    bwd_mm = bwd[bwd.op.str.contains(matmul)]
    assert not bwd_mm.module.str.contains("loss").any()
    assert (bwd.module != "").all()
    linear_modules = set(fwd_mm.module[fwd_mm.op.str.contains(r"aten\.(?:mm|addmm)\.")])
    counts = bwd_mm.module.value_counts()
    assert linear_modules and all(counts.get(m, 0) == 2 for m in linear_modules), counts.to_dict()
