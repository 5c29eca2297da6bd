"""The model's forward pass (parameters, buffers and batch -> loss) as an aten fx graph, and that graph as the
partitioner's OpGraph: the graph a training framework fuses, autograd deriving each fused op's backward.

In the traced training step (``trainplan.export.trace``) almost every forward op's output is saved for its
backward op, so it is an output op of any forward-only group and single-input/single-output groups stay at
2-4 ops. On the forward graph the saved tensors are the fused op's own business (AOT autograd decides
what its forward saves and what its backward recomputes), so the seed's rule leaves large groups.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from trainplan.export.trace import flat_inputs
from trainplan.fuse.check import check_grouping
from trainplan.fuse.errors import FuseError
from trainplan.fuse.exported import OUTPUT
from trainplan.fuse.graph import OpGraph, TensorInfo, build_graph
from trainplan.fuse.partitioner import Fusion, fuse_graph
from trainplan.fuse.split import split_groups
from trainplan.fuse.support import GETITEM, SupportTable, support_masks
from trainplan.models import BuiltModel


@dataclass
class ForwardGraph:
    """The forward graph ``gm(*inputs) -> loss``; ``inputs`` are the real tensors, parameters first (they
    require grad), then buffers and batch entries."""

    model: str
    gm: torch.fx.GraphModule
    inputs: list[torch.Tensor]
    param_names: list[str]

    @property
    def params(self) -> list[torch.Tensor]:
        return self.inputs[: len(self.param_names)]


def trace_forward(built: BuiltModel) -> ForwardGraph:
    """Trace ``built``'s loss with fake tensors (aten ops, as eager autograd runs them) and drop dead ops (the
    unused statistics a multi-output op returns); ops that mutate an input (batch-norm running stats) stay."""
    param_names, buffer_names, batch_names, flat = flat_inputs(built)
    n_p, n_b = len(param_names), len(buffer_names)

    def forward(*tensors: torch.Tensor) -> torch.Tensor:
        state = {**dict(zip(param_names, tensors[:n_p])), **dict(zip(buffer_names, tensors[n_p:n_p + n_b]))}
        out = torch.func.functional_call(built.module, state, args=(), kwargs=dict(zip(batch_names, tensors[n_p + n_b:])),
                                         tie_weights=True)
        return built.loss_fn(out)

    try:
        gm = make_fx(forward, tracing_mode="fake")(*flat)
    except Exception as exc:  # reported with the model, never a bare traceback
        raise FuseError(f"model '{built.name}': tracing the forward pass failed: {type(exc).__name__}: {exc}") from exc
    gm.graph.eliminate_dead_code()
    gm.recompile()
    inputs = [t.detach().requires_grad_(k < n_p) for k, t in enumerate(flat)]
    return ForwardGraph(built.name, gm, inputs, param_names)


def _infos(value: Any) -> list[TensorInfo]:
    if isinstance(value, torch.Tensor):
        return [TensorInfo(tuple(int(d) for d in value.shape), str(value.dtype).removeprefix("torch."))]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _infos(v)]
    return []


def op_graph(gm: torch.fx.GraphModule) -> OpGraph:
    """The fx graph's ops (``call_function`` nodes) joined by their data edges, with the shapes and dtypes of
    their traced values, plus the host node ``OUTPUT`` that the graph's result feeds (as for the export)."""
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    member = set(ops)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    edges = [(a.name, n.name) for n in ops for a in n.all_input_nodes if a in member]
    edges += [(a.name, OUTPUT) for a in output.all_input_nodes if a in member]
    names = [n.name for n in ops]
    if OUTPUT in names:
        raise FuseError(f"the forward graph has an op named '{OUTPUT}'")
    kinds = [GETITEM if n.target is operator.getitem else str(n.target) for n in ops]
    ins = [[t for a in n.all_input_nodes for t in _infos(a.meta.get("val"))] for n in ops]
    outs = [_infos(n.meta.get("val")) for n in ops]
    return build_graph([*names, OUTPUT], [*kinds, "output"], edges, [*ins, []], [*outs, []])


def forward_groups(fg: ForwardGraph, table: SupportTable, max_ops: int | None = None
                   ) -> tuple[OpGraph, Fusion, list[dict[str, Any]]]:
    """The seed's rule on the forward graph for ``table``: the partitioner's graph, its result and the groups
    (GROUPS.json entries, topological order), verified by the independent checker (a violation raises). Under
    ``max_ops`` the groups of more ops are split at their cuts (``trainplan.fuse.split``; ``fusion`` is the
    partitioner's result before)."""
    graph = op_graph(fg.gm)
    supported, broken = support_masks(graph, table)
    fusion = fuse_graph(graph, supported, broken)
    groups = fusion.to_dict(graph)["groups"]
    if max_ops is not None:
        groups = split_groups(graph, groups, max_ops)
    eligible = {graph.names[u] for u in range(graph.n) if fusion.eligible[u]}
    edges = [(graph.names[u], graph.names[v]) for u, v in graph.edges()]
    problems = check_grouping(graph.names, edges, eligible, groups, cycle_check_merges=graph.n <= 3000,
                              max_ops=max_ops)
    if problems:
        raise AssertionError(f"model '{fg.model}': forward grouping violates the rule: {problems[:3]}")
    return graph, fusion, groups
