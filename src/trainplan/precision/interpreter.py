"""Run a traced training step with every aten op at its assigned precision (forward and backward)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from trainplan.aten_ops import is_inplace

FP16_MAX = float(torch.finfo(torch.float16).max)  # 65504
_CASTABLE = (torch.float16, torch.float32)
INJECT_MODES = ("internal", "output")
# Arguments a kernel needs in fp32 whatever the op's precision (the fp16 flash-attention kernels keep
# their logsumexp in fp32): op overload -> positional indices left uncast.
FP32_ARGS = {"aten._scaled_dot_product_flash_attention_for_cpu_backward.default": (5,),
             "aten._scaled_dot_product_efficient_attention_backward.default": (6,),
             "aten._scaled_dot_product_flash_attention_backward.default": (5,),
             "aten.cudnn_batch_norm.default": (1, 2, 3, 4),
             "aten.cudnn_batch_norm_backward.default": (2, 3, 4, 5, 6)}
# Matmul-family ops whose fp16 run may be emulated as accelerators run them: fp16 inputs, fp32
# accumulation, output rounded to fp16 (CPU fp16 GEMM is 20-250x slower than fp32 on the dev machines).
EMULATED_FP16 = {"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.convolution", "aten.convolution_backward"}


class InjectionError(ValueError):
    """An injection names a node that is not in the graph, or has a bad scale or mode."""


@dataclass(frozen=True)
class Injection:
    """A known overflow root planted at one op (``node``: fx node name, as in nodes.parquet).

    ``internal`` (default): the op's result passes through an intermediate of magnitude ``|out| * scale``,
    as inside GELU's x^3 or a softmax denominator: elements whose intermediate exceeds the fp16 range
    become +-inf when the op runs in fp16; in fp32 the op is exact. Ground truth: the node is a root
    exactly when it runs in fp16 and ``max|out| * scale > 65504``, and deny-listing it removes the
    overflow. ``output``: the output itself is multiplied by ``scale`` in every precision, so large
    values also reach the consumers (which may then overflow in fp16 and be roots themselves).
    """

    node: str
    scale: float
    mode: str = "internal"

    def __post_init__(self) -> None:
        if self.mode not in INJECT_MODES:
            raise InjectionError(f"injection at '{self.node}': mode must be one of {INJECT_MODES}, got '{self.mode}'")
        if not self.scale > 0:
            raise InjectionError(f"injection at '{self.node}': scale must be > 0, got {self.scale}")

    def apply(self, value: Any) -> Any:
        """The op's output under this injection."""
        return tree_map(self._one, value)

    def _one(self, t: Any) -> Any:
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
            return t
        if self.mode == "output":
            return t * self.scale
        if t.dtype != torch.float16:
            return t
        over = t.float().abs() * self.scale > FP16_MAX
        return torch.where(over, torch.copysign(torch.full_like(t, float("inf")), t), t)


def parse_injections(entries: Iterable[dict[str, Any]], gm: torch.fx.GraphModule, model: str = "") -> dict[str, Injection]:
    """Injections from config entries ``{node, scale, mode?}``; an unknown node is an error naming it."""
    names = {n.name for n in gm.graph.nodes if n.op == "call_function"}
    out: dict[str, Injection] = {}
    for entry in entries:
        inj = Injection(str(entry["node"]), float(entry["scale"]), str(entry.get("mode", "internal")))
        if inj.node not in names:
            raise InjectionError(f"model '{model}': injection node '{inj.node}' is not an op of the traced graph (see nodes.parquet)")
        out[inj.node] = inj
    return out


def saturate(value: Any) -> Any:
    """Clamp fp16 tensors to +-65504, as saturating hardware (e.g. an NPU) stores an fp16 overflow."""
    return tree_map(lambda t: t.clamp(-FP16_MAX, FP16_MAX) if isinstance(t, torch.Tensor) and t.dtype == torch.float16 else t, value)


def _cast_args(args: tuple[Any, ...], kwargs: dict[str, Any], dtype: torch.dtype, keep: tuple[int, ...], sat: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Cast floating tensors (and floating dtype arguments) to ``dtype``, except positional args in ``keep``."""

    def cast(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dtype in _CASTABLE and x.dtype != dtype:
            y = x.to(dtype)
            return saturate(y) if sat else y
        if isinstance(x, torch.dtype) and x in _CASTABLE:
            return dtype
        return x

    cast_args = tuple(a if i in keep else tree_map(cast, a) for i, a in enumerate(args))
    return cast_args, tree_map(cast, kwargs)


def _kept_args(node: torch.fx.Node) -> tuple[int, ...]:
    """Positional args not to cast: the mutated arg 0 of in-place ops, and kernel-required fp32 args."""
    op = str(node.target)
    return ((0,) if is_inplace(op) else ()) + FP32_ARGS.get(op, ())


def _emulated_fp16(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run an fp16 matmul with fp32 accumulation: inputs already rounded to fp16, output rounded to fp16."""
    up = (lambda x: x.float() if isinstance(x, torch.Tensor) and x.dtype == torch.float16 else x)
    value = op(*tree_map(up, list(args)), **tree_map(up, kwargs))
    return tree_map(lambda x: x.half() if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x, value)


Observer = Callable[[torch.fx.Node, Any], None]


class PrecisionInterpreter(torch.fx.Interpreter):
    """fx Interpreter that runs each op in its dtype: floating inputs are cast to it before the op runs.

    ``saturating``: fp16 values are clamped to +-65504 instead of becoming inf (NPU-style hardware).
    ``emulate_matmul``: fp16 matmul-family ops run with fp32 accumulation on fp16-rounded inputs and
    round their output to fp16 (as tensor cores do); False runs the native CPU fp16 kernels.
    ``observer(node, value)`` sees every placeholder and op value as stored (after injection and
    saturation). ``on_step(interpreter, node)`` runs after each op, e.g. to measure live memory.
    """

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        dtypes: dict[str, torch.dtype],
        injections: dict[str, Injection] | None = None,
        *,
        saturating: bool = False,
        emulate_matmul: bool = True,
        observer: Observer | None = None,
        on_step: Callable[[PrecisionInterpreter, torch.fx.Node], None] | None = None,
    ) -> None:
        super().__init__(gm)
        self.dtypes = dtypes
        self.injections = injections or {}
        self.saturating = saturating
        self.emulate_matmul = emulate_matmul
        self.observer = observer
        self.on_step = on_step

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op != "call_function":
            value = super().run_node(n)
        else:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            dtype = self.dtypes.get(n.name)
            if dtype is not None and n.target is not operator.getitem:  # getitem selects, never casts
                args, kwargs = _cast_args(args, kwargs, dtype, _kept_args(n), self.saturating)
            if dtype == torch.float16 and self.emulate_matmul and str(getattr(n.target, "overloadpacket", "")) in EMULATED_FP16:
                value = _emulated_fp16(n.target, args, kwargs)
            else:
                value = n.target(*args, **kwargs)
            if n.name in self.injections:
                value = self.injections[n.name].apply(value)
            if self.saturating:
                value = saturate(value)
        if self.observer is not None and n.op != "output":
            self.observer(n, value)
        if self.on_step is not None and n.op == "call_function":
            self.on_step(self, n)
        return value


def run_step(
    gm: torch.fx.GraphModule,
    flat: list[torch.Tensor],
    dtypes: dict[str, torch.dtype],
    injections: dict[str, Injection] | None = None,
    *,
    saturating: bool = False,
    emulate_matmul: bool = True,
    observer: Observer | None = None,
) -> Any:
    """One training step of ``gm`` (outputs ``(loss, *grads)``) with per-op precision ``dtypes``."""
    with torch.no_grad():
        interp = PrecisionInterpreter(gm, dtypes, injections, saturating=saturating, emulate_matmul=emulate_matmul, observer=observer)
        return interp.run(*flat)
