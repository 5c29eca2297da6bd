"""Proof by execution: run an op on its padded tensors (as planned), unpad, compare with the unpadded op.

``run_padded`` pads every half-precision tensor of the op along the planned axes with the planned
values, reshapes it to a shape the op accepts, runs the *same aten op* (arguments that depend on the
shape remapped: softmax dim, reduction dims, pool indices, attention scale, conv bias sizes) and slices
the real elements out of every output. Two documented exceptions compute the padded op with torch
ops instead of the aten kernel: a masked batch norm (spatial pads; statistics over the real count,
which no aten kernel takes as an argument) and a mean over a padded reduced axis (rescaled).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from trainplan.align.problem import Problem, TensorView
from trainplan.precision.interpreter import EMULATED_FP16, _emulated_fp16

#: Round-off bound for results that are not bit-identical: |padded - unpadded| <= RTOL |unpadded| + ATOL max|unpadded|
RTOL, ATOL = 2.0**-8, 2.0**-10


def _value(text: str) -> float:
    return {"-inf": -math.inf, "+inf": math.inf}.get(text.split(" ")[0], 0.0)


def pad_view(x: torch.Tensor, t: TensorView, problem: Problem, padded: dict[str, int]) -> torch.Tensor:
    """``x`` reshaped to its view and padded at the end of every planned axis (one copy, then the pads filled)."""
    sizes = [problem.axes[a].size for a in t.view]
    y = x.reshape(sizes)
    target = [padded.get(a, s) for a, s in zip(t.view, sizes)]
    if target == sizes:
        return y
    out = torch.empty(target, dtype=y.dtype, device=y.device)
    out[tuple(slice(0, s) for s in sizes)] = y
    for i, a in enumerate(t.view):
        if target[i] > sizes[i]:
            out.narrow(i, sizes[i], target[i] - sizes[i]).fill_(_value(t.values.get(a, "0")))
    return out


def naive_pad(x: torch.Tensor, q: int) -> torch.Tensor:
    """Naive padding: every dimension of ``x`` zero-padded at its end to a multiple of q (one copy)."""
    pads = []
    for d in reversed(x.shape):
        pads += [0, -d % q]
    return torch.constant_pad_nd(x, pads) if any(pads) else x


def unpad_view(y: torch.Tensor, sizes: list[int], shape: tuple[int, ...]) -> torch.Tensor:
    """The real block ``[:s0, :s1, ...]`` of a padded view, reshaped to the tensor's shape."""
    return y[tuple(slice(0, s) for s in sizes)].reshape(shape)


Call = Callable[[Any, dict[str, Any]], Any]


def emulated_call(target: Any, kwargs: dict[str, Any]) -> Any:
    """Run the op; matmul-family ops in fp16 with fp32 accumulation, as the overflow stage runs them."""
    if str(getattr(target, "overloadpacket", "")) in EMULATED_FP16 and any(
            isinstance(v, torch.Tensor) and v.dtype == torch.float16 for v in kwargs.values()):
        return _emulated_fp16(target, (), kwargs)
    return target(**kwargs)


def native_call(target: Any, kwargs: dict[str, Any]) -> Any:
    """Run the op with the device's own kernels (fp16 matmuls on tensor cores on a GPU)."""
    return target(**kwargs)


class _Run:
    """One padded run: the op's bound arguments, its views and the planned sizes."""

    def __init__(self, target: Any, bound: dict[str, Any], problem: Problem, padded: dict[str, int], call: Call) -> None:
        self.target, self.bound, self.problem, self.padded, self.call = target, dict(bound), problem, padded, call
        self.views = {t.role: t for t in problem.tensors}

    def size(self, axis: str, padded: bool = True) -> int:
        return self.padded.get(axis, self.problem.axes[axis].size) if padded else self.problem.axes[axis].size

    def padded_arg(self, role: str, exec_shape: tuple[int, ...] | None = None) -> torch.Tensor:
        x = self.bound[role]
        y = pad_view(x, self.views[role], self.problem, self.padded)
        return y.reshape(exec_shape) if exec_shape is not None else y

    def out(self, y: torch.Tensor, view: tuple[str, ...], shape: tuple[int, ...]) -> torch.Tensor:
        return unpad_view(y.reshape([self.size(a) for a in view]), [self.size(a, False) for a in view], shape)


def _tensor_roles(run: _Run) -> list[str]:
    return [r for r in run.views if r in run.bound and not re.fullmatch(r"out\d+", r)]


def _elementwise(run: _Run, out_shapes: list[tuple[int, ...]]) -> Any:
    shape = out_shapes[0]
    n, n_pad = run.size("L", False), run.size("L")
    args = dict(run.bound)
    for name, v in run.bound.items():
        if isinstance(v, torch.Tensor) and v.dim() > 0 or (isinstance(v, torch.Tensor) and math.prod(shape) > 1):
            flat = v.expand(shape).reshape(-1)
            args[name] = torch.cat([flat, flat.new_zeros(n_pad - n)]) if n_pad > n else flat
    value = run.call(run.target, args)
    return tree_map(lambda y: y[:n].reshape(shape) if isinstance(y, torch.Tensor) else y, value)


def _softmax(run: _Run, out_shapes: list[tuple[int, ...]]) -> Any:
    args = dict(run.bound)
    first = run.views[_tensor_roles(run)[0]]
    shape = first.shape
    d = args["dim"] % len(shape)
    exec_shape = (run.size("R"), shape[d], math.prod(shape[d + 1:])) if run.problem.axes["M"].padable is False else (run.size("R"), run.size("M"))
    for role in _tensor_roles(run):
        args[role] = run.padded_arg(role, exec_shape)
    args["dim"] = 1
    y = run.call(run.target, args)
    return unpad_view(y, [run.size("R", False), run.size("M", False)] if len(exec_shape) == 2
                      else [run.size("R", False), shape[d], math.prod(shape[d + 1:])], out_shapes[0])


def _matmul(run: _Run, out_shapes: list[tuple[int, ...]]) -> Any:
    args = dict(run.bound)
    for role in _tensor_roles(run):
        args[role] = run.padded_arg(role)
    y = run.call(run.target, args)
    out_view = next(t.view for t in run.problem.tensors if t.role == "out0")
    return run.out(y, out_view, out_shapes[0])


def _pool(run: _Run, out_shapes: list[tuple[int, ...]]) -> Any:
    args = dict(run.bound)
    backward = "grad_output" in args
    x = args["self"]
    n, c, h, w = x.shape
    n_p, w_p = run.size("N"), run.size("W_in") if "W_in" in run.problem.axes else w
    args["self"] = run.padded_arg("self", (n_p, c, h, w_p))
    if backward:
        probe = torch.ops.aten.max_pool2d_with_indices.default(args["self"], *[run.bound[k] for k in ("kernel_size", "stride", "padding", "dilation", "ceil_mode")])[0]
        g = args["grad_output"]
        go = torch.zeros(probe.shape, dtype=g.dtype, device=g.device)
        go[: g.shape[0], :, : g.shape[2], : g.shape[3]] = g
        args["grad_output"] = go
        if "indices" in args:
            idx = args["indices"]
            full = torch.zeros(probe.shape, dtype=idx.dtype, device=idx.device)
            full[: idx.shape[0], :, : idx.shape[2], : idx.shape[3]] = idx // w * w_p + idx % w
            args["indices"] = full
        y = run.call(run.target, args)
        return y[:n, :, :, :w]
    value = run.call(run.target, args)
    outs = list(value) if isinstance(value, (tuple, list)) else [value]
    ho, wo = out_shapes[0][2], out_shapes[0][3]
    res = [o[:n, :, :ho, :wo] for o in outs]
    if len(res) > 1:  # indices into the padded plane -> the real one
        res[1] = res[1] // w_p * w + res[1] % w_p
    return tuple(res) if isinstance(value, (tuple, list)) else res[0]


def _masked_bn(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float, count: int) -> tuple[torch.Tensor, ...]:
    """Training batch norm over (N, C, HW'), zero spatial pads, statistics divided by the real count."""
    xf = x.float()
    mean = xf.sum((0, 2)) / count
    var = (xf * xf).sum((0, 2)) / count - mean * mean
    invstd = torch.rsqrt(var + eps)
    y = (xf - mean[None, :, None]) * invstd[None, :, None]
    if weight is not None:
        y = y * weight.float()[None, :, None]
    if bias is not None:
        y = y + bias.float()[None, :, None]
    return y.to(x.dtype), mean.to(x.dtype), invstd.to(x.dtype)


def _masked_bn_backward(g: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, mean: torch.Tensor,
                        invstd: torch.Tensor, count: int, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Backward of the masked training batch norm; ``mask`` marks the real spatial lanes (pads get no gradient)."""
    gf, xf, m = g.float(), x.float(), mask.float()
    xhat = (xf - mean.float()[None, :, None]) * invstd.float()[None, :, None] * m
    w = weight.float() if weight is not None else torch.ones_like(mean, dtype=torch.float32)
    sum_g, sum_gx = gf.sum((0, 2)), (gf * xhat).sum((0, 2))
    gx = (gf - sum_g[None, :, None] / count - xhat * sum_gx[None, :, None] / count) * (invstd.float() * w)[None, :, None] * m
    return gx.to(x.dtype), sum_gx.to(x.dtype), sum_g.to(x.dtype)


def _batch_norm(run: _Run, out_shapes: list[tuple[int, ...]]) -> Any:
    args = dict(run.bound)
    backward = "grad_out" in args
    roles = _tensor_roles(run)
    for role in roles:
        args[role] = run.padded_arg(role)
    masked = "HW" in run.padded and run.problem.axes["HW"].kind == "spatial"
    if masked:
        n, hw = run.size("N"), run.size("HW", False)
        mask = torch.zeros(run.size("HW"), device=args["input"].device)
        mask[:hw] = 1
        if backward:
            value = run.call(_masked_bn_backward, dict(g=args["grad_out"], x=args["input"], weight=args.get("weight"),
                                                       mean=args["save_mean"], invstd=args["save_invstd"], count=n * hw,
                                                       mask=mask[None, None, :]))
        else:
            value = run.call(_masked_bn, dict(x=args["input"], weight=args.get("weight"), bias=args.get("bias"),
                                              eps=args["eps"], count=n * hw))
    else:
        value = run.call(run.target, args)
    res = []
    for i, y in enumerate(value if isinstance(value, (tuple, list)) else [value]):
        role = f"out{i}"
        if role in run.views and y is not None:
            res.append(run.out(y, run.views[role].view, out_shapes[i] if i < len(out_shapes) else run.views[role].shape))
        else:
            res.append(y)
    return tuple(res)


def _reduction(run: _Run, out_shapes: list[tuple[int, ...]]) -> Any:
    name = run.target._schema.name.split("::")[-1]
    args = {**run.bound, "self": run.padded_arg("self")}
    if "dim" in args or any(a.name == "dim" for a in run.target._schema.arguments):
        args.update(dim=[1], keepdim=False)
    y = run.call(run.target, args)
    if name == "mean" and "R" in run.padded:
        y = y * (run.size("R") / run.size("R", False))
    return unpad_view(y, [run.size("A", False), run.size("C", False)], out_shapes[0])


def _attention(run: _Run, out_shapes: list[tuple[int, ...]]) -> Any:
    args = dict(run.bound)
    q = args["query"]
    b, h, length, d = q.shape
    lp, dp = run.size("L"), run.size("D")
    for role in ("query", "key", "value", "grad_out", "out"):
        if role in args and isinstance(args[role], torch.Tensor):
            args[role] = run.padded_arg(role, (b, h, lp, dp))
    if isinstance(args.get("attn_mask"), torch.Tensor):
        m = args["attn_mask"]
        mp = torch.zeros((*m.shape[:2], lp, lp), dtype=m.dtype, device=m.device)
        mp[..., :, length:] = -math.inf
        mp[..., :length, :length] = m
        args["attn_mask"] = mp
    if isinstance(args.get("logsumexp"), torch.Tensor):
        lse = args["logsumexp"]
        args["logsumexp"] = torch.cat([lse, torch.full((b, h, lp - length), math.inf, dtype=lse.dtype, device=lse.device)], dim=2)
    if args.get("scale") is None:
        args["scale"] = 1.0 / math.sqrt(d)
    value = run.call(run.target, args)
    res = [y[:, :, :length, :d] if y.dim() == 4 else y[:, :, :length] for y in value]
    return tuple(res)


def _convolution(run: _Run, out_shapes: list[tuple[int, ...]]) -> Any:
    args = dict(run.bound)
    backward = "grad_output" in args
    for role in _tensor_roles(run):
        v = args[role]
        args[role] = run.padded_arg(role).reshape(
            [run.size("Cout")] if v.dim() == 1 else
            ([run.size("Cout"), run.size("Cin"), *v.shape[2:]] if role == "weight" else
             [v.shape[0], run.size("Cin" if role == "input" else "Cout"), *v.shape[2:]]))
    if backward and args.get("bias_sizes") is not None:
        args["bias_sizes"] = [run.size("Cout")]
    value = run.call(run.target, args)
    if not backward:
        return value[:, : run.size("Cout", False)]
    cin, cout = run.size("Cin", False), run.size("Cout", False)
    gi, gw, gb = value
    return (gi[:, :cin] if gi is not None else None, gw[:cout, :cin] if gw is not None else None,
            gb[:cout] if gb is not None else None)


def _embedding(run: _Run, out_shapes: list[tuple[int, ...]]) -> Any:
    args = dict(run.bound)
    e = run.size("E", False)
    if "weight" in args:
        args["weight"] = run.padded_arg("weight")
        return run.call(run.target, args)[..., :e]
    g = args["grad_output"]
    args["grad_output"] = run.padded_arg("grad_output").reshape(*g.shape[:-1], run.size("E"))
    if "V" in run.padded:
        args["num_weights"] = run.size("V")
    return run.call(run.target, args)[: run.size("V", False), :e]


def _concat(run: _Run, out_shapes: list[tuple[int, ...]]) -> Any:
    tensors = run.bound["tensors"]
    d = run.bound.get("dim", 0) % tensors[0].dim()
    a_p = run.size("A")
    padded = []
    for i, t in enumerate(tensors):
        role = f"tensors.{i}"
        y = pad_view(t, run.views[role], run.problem, run.padded) if role in run.views else t.reshape(run.size("A", False), -1)
        padded.append(y.reshape(a_p, *t.shape[d:]))
    y = run.call(run.target, {"tensors": padded, "dim": 1})
    return y[: run.size("A", False)].reshape(out_shapes[0])


RUNNERS = {"elementwise": _elementwise, "softmax": _softmax, "matmul": _matmul, "pool": _pool,
           "batch_norm": _batch_norm, "reduction": _reduction, "attention": _attention,
           "convolution": _convolution, "embedding": _embedding, "concat": _concat}


def run_padded(target: Any, bound: dict[str, Any], problem: Problem, padded: dict[str, int], out_shapes: list[tuple[int, ...]],
               call: Call = emulated_call) -> Any:
    """The op's outputs computed on its padded tensors and unpadded (``bound``: arguments by schema name).

    ``call(fn, kwargs)`` runs the computation on the padded tensors (the aten op, or the masked batch norm).
    """
    return RUNNERS[problem.cls](_Run(target, bound, problem, padded, call), out_shapes)


@dataclass(frozen=True)
class Comparison:
    """Padded vs unpadded outputs of one op: bit-identical, or the largest error against the round-off bound."""

    identical: bool
    within_tolerance: bool
    max_abs_error: float
    max_error_over_bound: float


def compare(padded: Any, plain: Any) -> Comparison:
    """Compare every tensor output (NaN == NaN, inf == inf); floats within RTOL/ATOL when not identical."""
    ps = [p for p in (padded if isinstance(padded, (tuple, list)) else [padded])]
    rs = [r for r in (plain if isinstance(plain, (tuple, list)) else [plain])]
    identical, worst, ratio = True, 0.0, 0.0
    for p, r in zip(ps, rs):
        if not isinstance(r, torch.Tensor) or not isinstance(p, torch.Tensor):
            continue
        if p.shape != r.shape:
            return Comparison(False, False, math.inf, math.inf)
        if torch.equal(p, r) or (r.is_floating_point() and torch.equal(torch.nan_to_num(p), torch.nan_to_num(r))
                                 and torch.equal(p.isnan(), r.isnan())):
            continue
        identical = False
        if not r.is_floating_point():
            return Comparison(False, False, math.inf, math.inf)
        pf, rf = p.double(), r.double()
        same = (pf == rf) | (pf.isnan() & rf.isnan())
        err = torch.where(same, torch.zeros_like(pf), (pf - rf).abs())
        finite = rf[rf.isfinite()]
        bound = RTOL * rf.abs() + ATOL * (finite.abs().max() if finite.numel() else 0.0)
        worst = max(worst, float(err.max()))
        over = torch.where(same, torch.zeros_like(err), err / bound.clamp_min(1e-300))
        ratio = max(ratio, float(over.max()))
    return Comparison(identical, identical or ratio <= 1.0, worst, ratio)
