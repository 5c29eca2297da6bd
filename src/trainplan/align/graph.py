"""The half-precision ops of a traced training step under a precision assignment, as OpSpecs to plan."""

from __future__ import annotations

import operator
from typing import Any

import torch

from trainplan.align.classes import OpSpec
from trainplan.precision.interpreter import FP32_ARGS

#: Outputs a half-precision kernel keeps in fp32 (the attention kernels' logsumexp): op -> output indices.
FP32_OUTPUTS = {"aten._scaled_dot_product_flash_attention_for_cpu.default": (1,),
                "aten._scaled_dot_product_efficient_attention.default": (1,),
                "aten._scaled_dot_product_flash_attention.default": (1,)}
HALF_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def bound_args(node: torch.fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name (positional and keyword), without defaults."""
    if node.target is operator.getitem:
        return {"self": node.args[0], "index": node.args[1]}
    names = [a.name for a in node.target._schema.arguments]
    return {**dict(zip(names, node.args)), **node.kwargs}


def _shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return tuple(int(d) for d in value.shape)
    return None


def op_spec(node: torch.fx.Node, dtype: torch.dtype) -> OpSpec:
    """OpSpec of an op node that runs in ``dtype``: shapes of its floating tensors, its other args by name."""
    op = "getitem" if node.target is operator.getitem else str(node.target)
    inputs: dict[str, tuple[int, ...]] = {}
    args: dict[str, Any] = {}
    kept = FP32_ARGS.get(op, ())
    names = list(bound_args(node))
    for name, value in bound_args(node).items():
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.fx.Node) for v in value):
            for i, v in enumerate(value):
                if (s := _shape(v)) is not None:
                    inputs[f"{name}.{i}"] = s
        elif isinstance(value, torch.fx.Node):
            s = _shape(value)
            if s is not None and names.index(name) not in kept:
                inputs[name] = s
        else:
            args[name] = value
    if node.target is operator.getitem:
        shape = _shape(node)
        inputs = {"self": shape} if shape is not None else {}
    outputs: dict[str, tuple[int, ...]] = {}
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    if node.target is not operator.getitem:
        for i, v in enumerate(vals):
            if (s := _shape(v)) is not None and i not in FP32_OUTPUTS.get(op, ()):
                outputs[f"out{i}"] = s
    return OpSpec(node.name, op, HALF_DTYPES[dtype], inputs, outputs, args)


def half_ops(gm: torch.fx.GraphModule, dtypes: dict[str, torch.dtype]) -> list[tuple[torch.fx.Node, OpSpec]]:
    """Every op node assigned a 16-bit float dtype with at least one floating tensor, in execution order."""
    out = []
    for node in gm.graph.nodes:
        dtype = dtypes.get(node.name)
        if node.op != "call_function" or dtype not in HALF_DTYPES:
            continue
        spec = op_spec(node, dtype)
        if spec.inputs or spec.outputs:
            out.append((node, spec))
    return out
