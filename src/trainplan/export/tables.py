"""Turn a traced training step into open-format tables: one row per op node and one per tensor."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.flop_counter import flop_registry

from trainplan.export import embedding_grad_op, loss_head_op
from trainplan.export.memory import memory_profile
from trainplan.export.trace import TracedStep, backward_seq_nr, module_path

FORWARD, BACKWARD = "forward", "backward"
#: trainplan's own ops: their FLOPs and the bytes a call holds besides its outputs (``workspace_bytes``), from
#: the fake values of their arguments
_OWN_OPS = {loss_head_op.linear_cross_entropy._opoverload: (loss_head_op.flops, loss_head_op.workspace_bytes),
            embedding_grad_op.embedding_grad_add._opoverload: (embedding_grad_op.flops,
                                                               embedding_grad_op.workspace_bytes),
            embedding_grad_op.embedding_grad_add_: (embedding_grad_op.flops, embedding_grad_op.workspace_bytes)}


@dataclass
class GraphTables:
    """The exported graph: op nodes, tensors and a summary (see docs/artifacts.md)."""

    nodes: pd.DataFrame
    tensors: pd.DataFrame
    summary: dict[str, Any]


def _tensor_values(val: Any) -> list[torch.Tensor | None]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)):
        return [v if isinstance(v, torch.Tensor) else None for v in val]
    return []


def _flops(node: torch.fx.Node, aliases_input: bool) -> float:
    """FLOPs from PyTorch's flop-counter formulas; elementwise estimate (output numel) otherwise."""
    if node.target in _OWN_OPS:  # the in-place embedding gradient sum aliases its input, and computes
        return _OWN_OPS[node.target][0](*_arg_values(node))
    if aliases_input or node.target is operator.getitem:
        return 0.0
    packet = getattr(node.target, "overloadpacket", None)
    val = node.meta.get("val")
    if packet in flop_registry:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
        return float(flop_registry[packet](*args, **kwargs, out_val=val))
    return float(sum(t.numel() for t in _tensor_values(val) if t is not None))


def _arg_values(node: torch.fx.Node) -> tuple:
    return torch.fx.node.map_arg(node.args, lambda n: n.meta.get("val"))


def _workspace(node: torch.fx.Node) -> int:
    """Bytes a call of one of trainplan's own ops holds besides its outputs; 0 for others (not measured)."""
    return int(_OWN_OPS[node.target][1](*_arg_values(node))) if node.target in _OWN_OPS else 0


def _input_tensors(node: torch.fx.Node, tensor_of: dict[str, list[str]]) -> list[str]:
    """Tensor ids a node reads; ``getitem`` reads only the element it selects."""
    if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        element = f"{node.args[0].name}.{node.args[1]}"
        return [element] if element in tensor_of.get(node.args[0].name, []) else []
    return [t for a in node.all_input_nodes for t in tensor_of.get(a.name, [])]


def _module(node: torch.fx.Node, phase: str, module_of: dict[str, str], module_of_seq: dict[int, str]) -> str:
    """Module path of an op. Forward: the innermost module running it (its autograd sequence number is
    remembered for the first op carrying it, the op that created the backward function). Backward: the
    module of the forward op with the same sequence number (``trace.link_backward_to_forward``); an op
    with none (gradient accumulation between functions) or a forward op outside every module inherits
    from its first input that has one."""
    seq = node.meta.get("seq_nr")
    if phase == FORWARD:
        module = module_path(node)
        if module and isinstance(seq, int):
            module_of_seq.setdefault(seq, module)
    else:
        grad_fn = backward_seq_nr(node)
        module = module_of_seq.get(grad_fn, "") if grad_fn is not None else ""
    if not module:
        module = next((module_of[a.name] for a in node.all_input_nodes if module_of.get(a.name)), "")
    return module


def graph_tables(traced: TracedStep) -> GraphTables:
    """Build node and tensor tables from a traced step; storages are de-duplicated across aliases."""
    kinds = iter(traced.placeholder_kinds())
    output_node = next(n for n in traced.gm.graph.nodes if n.op == "output")
    graph_outputs = {a.name for a in output_node.args[0] if isinstance(a, torch.fx.Node)}
    grad_outputs = {a.name for a in output_node.args[0][1:] if isinstance(a, torch.fx.Node)}
    storage_ids: dict[StorageWeakRef, int] = {}
    tensor_of: dict[str, list[str]] = {}  # node name -> its output tensor ids
    storage_of: dict[str, int] = {}
    tensor_rows: list[dict[str, Any]] = []
    node_rows: list[dict[str, Any]] = []
    phase = FORWARD
    module_of: dict[str, str] = {}
    module_of_seq: dict[int, str] = {}  # autograd sequence number -> module of the forward op that has it
    for node in traced.gm.graph.nodes:
        if node.op == "output":
            continue
        values = _tensor_values(node.meta.get("val"))
        is_op = node.op == "call_function"
        kind = next(kinds) if node.op == "placeholder" else ("constant" if node.op == "get_attr" else None)
        in_tensors = _input_tensors(node, tensor_of)
        in_storages = {storage_of[t] for t in in_tensors}
        ids, new_bytes, aliases = [], 0, False
        for i, val in enumerate(values):
            if val is None:
                continue
            tid = node.name if isinstance(node.meta.get("val"), torch.Tensor) else f"{node.name}.{i}"
            ref = StorageWeakRef(val.untyped_storage())
            fresh = ref not in storage_ids
            sid = storage_ids.setdefault(ref, len(storage_ids))
            aliases |= sid in in_storages
            storage_bytes = int(val.untyped_storage().nbytes())
            new_bytes += storage_bytes if fresh else 0
            storage_of[tid] = sid
            ids.append(tid)
            if kind is None:
                kind = "gradient" if phase == BACKWARD or node.name in grad_outputs else "activation"
            tensor_rows.append(
                {
                    "tensor_id": tid,
                    "node": node.name,
                    "shape": str(list(val.shape)),
                    "dtype": str(val.dtype).removeprefix("torch."),
                    "numel": int(val.numel()),
                    "bytes": int(val.numel() * val.element_size()),
                    "storage": sid,
                    "storage_bytes": storage_bytes,
                    "kind": kind,
                    "is_graph_output": node.name in graph_outputs,
                }
            )
        tensor_of[node.name] = ids
        if not is_op:
            continue
        module = _module(node, phase, module_of, module_of_seq)
        module_of[node.name] = module
        node_rows.append(
            {
                "node_id": len(node_rows),
                "name": node.name,
                "op": str(node.target) if node.target is not operator.getitem else "getitem",
                "module": module,
                "phase": phase,
                "inputs": in_tensors,
                "outputs": ids,
                "input_nodes": [a.name for a in node.all_input_nodes],
                "alloc_bytes": new_bytes,
                "is_view": aliases and new_bytes == 0,
                "flops": _flops(node, aliases and new_bytes == 0),
                "workspace_bytes": _workspace(node),
            }
        )
        if node.name == traced.loss_node:
            phase = BACKWARD
    nodes = pd.DataFrame(node_rows)
    tensors = pd.DataFrame(tensor_rows)
    summary = {
        "model": traced.model,
        "loss_node": traced.loss_node,
        "n_ops": len(nodes),
        "n_forward": int((nodes.phase == FORWARD).sum()),
        "n_backward": int((nodes.phase == BACKWARD).sum()),
        "n_parameters": len(traced.param_names),
        "total_flops": float(nodes.flops.sum()),
    }
    return GraphTables(nodes, tensors, summary)


def memory_table(tables: GraphTables) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per-op live bytes of the in-order execution and its summary (fixed bytes, peak, peak op)."""
    mem = memory_profile(tables.nodes, tables.tensors)
    frame = pd.DataFrame(
        {
            "node_id": tables.nodes.node_id,
            "name": tables.nodes.name,
            "phase": tables.nodes.phase,
            "live_bytes": mem.live_bytes,
        }
    )
    summary = {
        "fixed_bytes": mem.fixed_bytes,
        "activation_peak_bytes": mem.peak_bytes - mem.fixed_bytes,
        "peak_bytes": mem.peak_bytes,
        "peak_node": mem.peak_node,
    }
    return frame, summary
