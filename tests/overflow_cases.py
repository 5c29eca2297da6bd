"""Tiny models for the overflow tests: eager-attention GPT-2 and T5 with T5-style wi/wo scaling."""

from __future__ import annotations

from typing import Any

import torch

from trainplan.export.tables import graph_tables
from trainplan.export.trace import TracedStep
from trainplan.precision.cases import build_case

GPT2_EAGER: dict[str, Any] = {
    "architecture": "GPT2LMHeadModel",
    "config": {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 256, "n_positions": 64, "attn_implementation": "eager"},
    "inputs": {"batch_size": 2, "seq_len": 16},
}
T5_TINY: dict[str, Any] = {
    "architecture": "T5ForConditionalGeneration",
    "config": {"d_model": 64, "d_ff": 256, "num_heads": 2, "d_kv": 32, "num_layers": 3, "num_decoder_layers": 2,
               "vocab_size": 256, "decoder_start_token_id": 0, "pad_token_id": 0},
    "inputs": {"batch_size": 2, "seq_len": 16},
}
# Encoder blocks 1 and 2: wo's output peaks ~1e5 (random-init peak ~3 times 180**2), as trained T5's does.
T5_SCALE = [{"pattern": r"encoder\.block\.[12]\.layer\.1\.DenseReluDense\.w[io]\.weight", "factor": 180.0}]


def traced_case(name: str, spec: dict[str, Any], param_scale: list[dict[str, Any]] | None = None) -> tuple[TracedStep, list[torch.Tensor]]:
    """Traced step and real inputs of a tiny case."""
    traced, flat, _ = build_case(name, spec, 0, param_scale or [])
    return traced, flat


def op_nodes(traced: TracedStep, op: str, module: str = "", phase: str = "") -> list[str]:
    """Node names of ``op`` (overload string) under a module path substring and phase, in execution order."""
    nodes = graph_tables(traced).nodes
    mask = (nodes.op == op) & nodes.module.str.contains(module, regex=False)
    if phase:
        mask &= nodes.phase == phase
    return nodes.loc[mask, "name"].tolist()
