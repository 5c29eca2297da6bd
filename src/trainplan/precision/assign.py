"""Static per-op precision: resolve a policy's allow / deny / infer lists to one dtype per graph node."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trainplan.precision.policy import ALLOW, DENY, Policy, list_of, op_keys

FP16, FP32 = torch.float16, torch.float32
_SINK_WORDS = ("softmax", "scaled_dot_product")


def is_floating(node: torch.fx.Node) -> bool:
    """True when a node produces at least one floating-point tensor."""
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    return any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in vals)


def node_phases(gm: torch.fx.GraphModule, loss_node: str) -> dict[str, str]:
    """Phase of every op node: ``forward`` up to and including the loss, then ``backward``."""
    phases, phase = {}, "forward"
    for node in gm.graph.nodes:
        if node.op == "call_function":
            phases[node.name] = phase
            if node.name == loss_node:
                phase = "backward"
    return phases


def data_nodes(gm: torch.fx.GraphModule) -> set[str]:
    """Op nodes whose values depend on a floating placeholder (model data), not only on constants."""
    data: set[str] = set()
    for node in gm.graph.nodes:
        floating_input = node.op == "placeholder" and is_floating(node)
        if floating_input or (node.op == "call_function" and any(a.name in data for a in node.all_input_nodes)):
            data.add(node.name)
    return data


@dataclass(frozen=True)
class Assignment:
    """Per-node dtype (fp16 / fp32) and the list that decided it."""

    dtype: dict[str, torch.dtype]
    source: dict[str, str]  # allow / deny / infer
    phase: dict[str, str]


def assign_precision(gm: torch.fx.GraphModule, policy: Policy, loss_node: str) -> Assignment:
    """Resolve ``policy`` over the graph in execution order (infer ops need their producers first)."""
    phases = node_phases(gm, loss_node)
    data = data_nodes(gm)
    dtype: dict[str, torch.dtype] = {}
    source: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            dtype[node.name] = val.dtype if isinstance(val, torch.Tensor) else FP32
            continue
        if node.op != "call_function":
            continue
        which = list_of(node, policy, phases[node.name])
        source[node.name] = which
        if which == ALLOW:
            dtype[node.name] = FP16
        elif which == DENY:
            dtype[node.name] = FP32
        else:
            dtype[node.name] = _inferred(node, policy, data, dtype)
    return Assignment({n: d for n, d in dtype.items() if n in source}, source, phases)


def _inferred(node: torch.fx.Node, policy: Policy, data: set[str], dtype: dict[str, torch.dtype]) -> torch.dtype:
    """fp16 iff every voting floating input is fp16 (producer mode: data-carrying ops; promote: all)."""
    voters = []
    for arg in node.all_input_nodes:
        if not is_floating(arg):
            continue
        if arg.op == "placeholder":
            if policy.infer_mode == "promote":
                voters.append(dtype[arg.name])
        elif arg.name in data or policy.infer_mode == "promote":
            voters.append(dtype[arg.name])
    return FP16 if voters and all(v == FP16 for v in voters) else FP32


def fp32_dtypes(gm: torch.fx.GraphModule) -> dict[str, torch.dtype]:
    """Every op in fp32 (the all-fp32 baseline)."""
    return {n.name: FP32 for n in gm.graph.nodes if n.op == "call_function"}


def sentinel_nodes(gm: torch.fx.GraphModule) -> set[str]:
    """Nodes that may hold attention-mask sentinels (finfo(float32).min or -inf fills) on purpose.

    Seeded by ops with a constant argument of magnitude >= 1e38 or infinite, propagated to users up to
    (not including) softmax / attention ops, which absorb the sentinel. Detection ignores negative
    saturation (-inf, -65504) in these nodes only; NaN and positive overflow are still recorded.
    """
    tainted: set[str] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if any(w in op_keys(node)[1] for w in _SINK_WORDS):
            continue
        scalars = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, float)]
        if any(math.isinf(a) or abs(a) >= 1e38 for a in scalars) or any(a.name in tainted for a in node.all_input_nodes):
            tainted.add(node.name)
    return tainted
