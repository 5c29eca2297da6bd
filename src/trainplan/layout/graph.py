"""The conv graph of a real model: its Conv2d modules, the ops between them, and which conv feeds which.

One forward pass runs under a ``TorchDispatchMode`` that follows every 4-D activation from the conv (or the
input) that produced it through the ops after it. Each non-conv op joins the group of the conv that produced
its activation input (batch norm, activation, pooling after a conv); a residual add or concat joins the group of
its latest operand (in call order), and its other operands are edges into that group, so edges run forward. Ops whose output is not 4-D
(flatten, a linear head) stay in their group and end the tracking. The ops are kept with placeholders for the
tracked activations so that ``measure`` can replay each group from its conv's output in every layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

INPUT = "input"
CONV_OPS = {"aten.convolution.default", "aten.conv2d.default", "aten.mkldnn_convolution.default"}


class LayoutGraphError(ValueError):
    """The model's convs cannot be mapped to a layout graph; the message names the model and module."""


@dataclass
class ConvInfo:
    """One Conv2d module's call: shapes and hyper-parameters (the predictor's features)."""

    id: str
    in_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    bias: bool
    dtype: str


@dataclass(frozen=True)
class Ref:
    """Placeholder for a tracked activation in a recorded op's arguments."""

    key: int


@dataclass
class OpCall:
    """A non-conv op between convs: its arguments (tracked activations as ``Ref``, other tensors copied), the
    keys of its tracked outputs, and the shapes of its activation inputs by key (to rebuild them)."""

    group: str
    name: str
    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: list[int]
    inputs: dict[int, torch.Tensor]


@dataclass
class ConvGraph:
    """Conv groups (conv + the ops after it), edges between groups with the tensors they carry."""

    model: str
    convs: dict[str, ConvInfo]
    ops: list[OpCall]
    edges: dict[tuple[str, str], list[tuple[int, ...]]] = field(default_factory=dict)

    conv_outputs: dict[str, int] = field(default_factory=dict)

    @property
    def groups(self) -> list[str]:
        """Node ids: ``input`` and every conv in call order."""
        return [INPUT, *self.convs]


class _Recorder(TorchDispatchMode):
    def __init__(self, model: str, names: dict[int, str]) -> None:
        super().__init__()
        self.model, self.names = model, names
        self.current: list[str] = []
        self.src: dict[int, str] = {}
        self.keep: list[torch.Tensor] = []
        self.convs: dict[str, ConvInfo] = {}
        self.ops: list[OpCall] = []
        self.edges: dict[tuple[str, str], list[tuple[int, ...]]] = {}
        self.conv_outputs: dict[str, int] = {}

    def tag(self, t: torch.Tensor, group: str) -> None:
        self.src[id(t)] = group
        self.keep.append(t)

    def _edge(self, src: str, dst: str, shape: tuple[int, ...]) -> None:
        if src != dst:
            self.edges.setdefault((src, dst), []).append(shape)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        acts = [a for a in tree_flatten((args, kwargs))[0]
                if isinstance(a, torch.Tensor) and a.dim() == 4 and id(a) in self.src]
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        if name in CONV_OPS:
            if not self.current:
                raise LayoutGraphError(f"model '{self.model}': a convolution ran outside any Conv2d module")
            cid = self.current[-1]
            if cid in self.convs:
                raise LayoutGraphError(f"model '{self.model}': Conv2d '{cid}' runs twice in one step (shared weights)")
            x, w = args[0], args[1]
            stride, padding, dilation = (tuple(int(v) for v in args[i]) for i in (3, 4, 5))
            self.convs[cid] = ConvInfo(cid, tuple(x.shape), tuple(w.shape), tuple(out.shape), stride, padding,
                                       dilation, int(args[8]), args[2] is not None, str(x.dtype).replace("torch.", ""))
            if acts:
                self._edge(self.src[id(acts[0])], cid, tuple(acts[0].shape))
            self.tag(out, cid)
            self.conv_outputs[cid] = id(out)
            return out
        if not acts:
            return out
        order = {g: i for i, g in enumerate([INPUT, *self.convs])}
        group = max((self.src[id(a)] for a in acts), key=order.__getitem__)
        for a in acts:
            self._edge(self.src[id(a)], group, tuple(a.shape))
        tracked = {id(a) for a in acts}
        rec_args, rec_kwargs = tree_map(
            lambda a: Ref(id(a)) if isinstance(a, torch.Tensor) and id(a) in tracked
            else a.detach().clone() if isinstance(a, torch.Tensor) else a, (args, kwargs))
        primary_4d = bool(outs) and outs[0].dim() == 4
        out_keys = [id(o) for o in outs if o.dim() == 4] if primary_4d else []
        self.ops.append(OpCall(group, name, func, rec_args, rec_kwargs, out_keys,
                               {id(a): a.detach().clone() for a in acts}))
        for o in outs:
            if primary_4d and o.dim() == 4:
                self.tag(o, group)
        return out


def trace_conv_graph(model_name: str, module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> ConvGraph:
    """Run one forward pass (no grad, on a copy's state: BN statistics are restored) and build the conv graph."""
    names = {id(m): n for n, m in module.named_modules() if isinstance(m, torch.nn.Conv2d)}
    if not names:
        raise LayoutGraphError(f"model '{model_name}' has no Conv2d module")
    rec = _Recorder(model_name, names)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    def enter(mod: torch.nn.Module, _args: Any) -> None:
        rec.current.append(names[id(mod)])

    def leave(_mod: torch.nn.Module, _args: Any, _out: Any) -> None:
        rec.current.pop()

    hooks = []
    for m in module.modules():
        if id(m) in names:
            hooks += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
    try:
        with torch.no_grad(), rec:
            for value in batch.values():
                if isinstance(value, torch.Tensor) and value.dim() == 4:
                    rec.tag(value, INPUT)
            module(**batch)
    finally:
        for h in hooks:
            h.remove()
        module.load_state_dict(state)
    return ConvGraph(model_name, rec.convs, rec.ops, rec.edges, rec.conv_outputs)
