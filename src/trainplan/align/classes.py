"""Op classes of the seed's alignment method: how each aten op computes, as a padding problem.

``classify`` names the class of an aten overload; ``build_problem`` turns an op with the shapes of its
half-precision tensors into a :class:`~trainplan.align.problem.Problem`. Classes (docs/align.md):

* ``elementwise`` (seed s1, 1-D): ops tagged pointwise and copies; the flat length padded at the end.
* ``softmax`` (s2): softmax / log-softmax and their backward kernels, n x m with m the softmax dim:
  a zero row, or a column of -inf (exp(-inf) = 0 keeps every denominator).
* ``matmul`` (s2, fc): mm, addmm, bmm, baddbmm, linear; rows (M), columns (K, zero in both operands) or
  output columns (N).
* ``pool`` (s2): max/avg pooling and their backward kernels; rows (samples) or one column after each w
  (-inf for a max; an average pool pads rows only).
* ``batch_norm`` (s3 in training: n, c, h*w with c and h*w aligned; s2 in eval: rows or one column after
  each h*w); a spatial pad is masked: statistics divide by the real count.
* ``reduction``: sum / mean / amax / amin over a contiguous block of dims, viewed as kept x reduced:
  kept lanes padded with 0, reduced ones with 0 (sum), 0 and rescaling (mean), -inf (amax), +inf (amin).
* ``attention`` (fused scaled-dot-product kernels): head dim padded with zeros and the scale passed as
  1/sqrt(real head dim); sequence padded only under a causal mask (padded keys come after every query).
* ``convolution`` (and its backward): channels padded (zero input channels meet zero weights; added
  output channels are discarded); spatial dims never (a pad would enter the windows).
* ``embedding`` (and its dense backward): table rows (never indexed) or columns.
* ``concat``: rows before the concat dim.
* ``view``: aliases (view, transpose, expand, split, getitem ...): no data moves, nothing to pad; the
  op that reads the data pads it.
* ``naive``: every other aten op: every dimension of every tensor padded (no neutral layout known).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainplan.align.problem import ALL, EITHER, FLAT, Axis, Problem, TensorView
from trainplan.align.units import AlignError

Shape = tuple[int, ...]


@dataclass(frozen=True)
class OpSpec:
    """One op to plan: id, aten overload, dtype, the shapes of its half-precision tensors and its other args.

    ``inputs``: schema argument name -> shape (``tensors.i`` for the i-th tensor of a list argument);
    ``outputs``: ``out0``, ``out1`` ... -> shape. Only the class's primary input is required.
    """

    id: str
    op: str
    dtype: str
    inputs: dict[str, Shape]
    outputs: dict[str, Shape] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)


GETITEM = "getitem"
ELEMENTWISE_EXTRA = {"_to_copy", "copy", "copy_", "fill_", "zero_", "native_dropout", "native_dropout_backward",
                     "threshold_backward", "tanh_backward", "sigmoid_backward", "gelu_backward", "silu_backward",
                     "hardtanh_backward", "leaky_relu_backward", "elu_backward", "where", "masked_fill", "clone"}
SOFTMAX = {"_softmax", "_log_softmax", "_safe_softmax"}
SOFTMAX_BACKWARD = {"_softmax_backward_data", "_log_softmax_backward_data"}
MATMUL = {"mm", "addmm", "bmm", "baddbmm", "linear"}
POOL = {"max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward"}
BATCH_NORM = {"native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit_functional",
              "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "batch_norm_backward"}
REDUCTION = {"sum": "0", "mean": "0 (rescaled)", "amax": "-inf", "amin": "+inf"}
ATTENTION = {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
             "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward"}
CONVOLUTION = {"convolution", "convolution_backward"}
EMBEDDING = {"embedding", "embedding_dense_backward"}
CONCAT = {"cat"}
VIEW_EXTRA = {"_unsafe_view", "reshape"}


def resolve(op: str, where: str) -> Any:
    """The aten overload named ``aten.<name>.<overload>`` (``.default`` when omitted), or ``getitem``."""
    if op in (GETITEM, "<built-in function getitem>"):
        return operator.getitem
    parts = op.split(".")
    if len(parts) not in (2, 3) or parts[0] != "aten":
        raise AlignError(f"{where}unknown op '{op}': expected 'aten.<name>[.<overload>]'")
    packet = getattr(torch.ops.aten, parts[1], None)
    overload = getattr(packet, parts[2] if len(parts) == 3 else "default", None) if packet is not None else None
    if not isinstance(overload, torch._ops.OpOverload):
        raise AlignError(f"{where}unknown op '{op}': no such aten overload")
    return overload


def classify(target: Any) -> str:
    """Class name of a resolved op (an aten overload or getitem)."""
    if target is operator.getitem:
        return "view"
    name = target._schema.name.split("::")[-1]
    returns = target._schema.returns
    if name in VIEW_EXTRA or (returns and returns[0].alias_info is not None and not returns[0].alias_info.is_write
                              and not target._schema.is_mutable):
        return "view"
    for cls, names in (("softmax", SOFTMAX | SOFTMAX_BACKWARD), ("matmul", MATMUL), ("pool", POOL),
                       ("batch_norm", BATCH_NORM), ("attention", ATTENTION), ("convolution", CONVOLUTION),
                       ("embedding", EMBEDDING), ("concat", CONCAT)):
        if name in names:
            return cls
    if name in REDUCTION:
        return "reduction"
    if torch.Tag.pointwise in target.tags or name in ELEMENTWISE_EXTRA:
        return "elementwise"
    return "naive"


def primary_arg(target: Any) -> str:
    """Schema name of the tensor a class plans first (the 'shape' of an OPS.json entry)."""
    if target is operator.getitem:
        return "self"
    name = target._schema.name.split("::")[-1]
    special = {"addmm": "mat1", "baddbmm": "batch1", "cat": "tensors.0"}
    if name in special:
        return special[name]
    for arg in target._schema.arguments:
        if arg.type.isSubtypeOf(torch._C.TensorType.get()) or str(arg.type) == "Tensor":
            return arg.name
    raise AlignError(f"op '{target}' has no tensor argument")


# ---------------------------------------------------------------------------------------------- helpers


def _arg(spec: OpSpec, target: Any, name: str) -> Any:
    """A non-tensor argument by schema name, or its schema default."""
    if name in spec.args:
        return spec.args[name]
    for arg in target._schema.arguments:
        if arg.name == name:
            if arg.has_default_value():
                return arg.default_value
            break
    raise AlignError(f"op '{spec.id}' ({spec.op}): argument '{name}' is required")


def _dim(spec: OpSpec, d: int, rank: int) -> int:
    if not -rank <= d < max(rank, 1):
        raise AlignError(f"op '{spec.id}' ({spec.op}): dim {d} out of range for a {rank}-D tensor")
    return d % max(rank, 1)


def _need_rank(spec: OpSpec, role: str, shape: Shape, ranks: tuple[int, ...]) -> None:
    if len(shape) not in ranks:
        raise AlignError(f"op '{spec.id}' ({spec.op}): tensor '{role}' has shape {list(shape)}, "
                         f"expected {' or '.join(str(r) for r in ranks)} dimensions")


def _check(spec: OpSpec, role: str, got: int, want: int, what: str) -> None:
    if got != want:
        raise AlignError(f"op '{spec.id}' ({spec.op}): tensor '{role}' has {what} {got}, expected {want}")


#: Matmul rules: the seed's DMA rule (each operand's row count or row length a multiple of q) and the
#: tensor-core rule (every dimension M, K, N a multiple of q, as fp16 tensor-core GEMMs want).
MATMUL_RULES = ("dma", "tensor_core")


class _Builder:
    """Collects axes and tensor views; an axis seen twice must have the same size."""

    def __init__(self, spec: OpSpec, cls: str, matmul_rule: str = "dma") -> None:
        self.spec, self.cls, self.matmul_rule = spec, cls, matmul_rule
        self.axes: dict[str, Axis] = {}
        self.tensors: list[TensorView] = []

    def axis(self, name: str, size: int, kind: str, padable: bool = True, reason: str = "") -> str:
        old = self.axes.get(name)
        if old is not None and old.size != size:
            raise AlignError(f"op '{self.spec.id}' ({self.spec.op}): {kind} size {size} does not match {old.size}")
        if old is None:
            self.axes[name] = Axis(name, size, kind, padable, reason)
        return name

    def tensor(self, role: str, shape: Shape, view: tuple[str, ...], rule: str,
               groups: tuple[tuple[str, ...], ...] = (), values: dict[str, str] | None = None) -> None:
        size = math.prod(self.axes[a].size for a in view)
        if size != math.prod(shape):
            raise AlignError(f"op '{self.spec.id}' ({self.spec.op}): tensor '{role}' shape {list(shape)} does not fit the op")
        self.tensors.append(TensorView(role, tuple(shape), view, rule, groups, dict(values or {})))

    def problem(self, note: str = "") -> Problem:
        return Problem(self.spec.op, self.cls, self.axes, self.tensors, note)


def _all_tensors(spec: OpSpec) -> list[tuple[str, Shape]]:
    return list(spec.inputs.items()) + list(spec.outputs.items())


# ---------------------------------------------------------------------------------------------- classes


def _elementwise(spec: OpSpec, target: Any, b: _Builder) -> Problem:
    shapes = _all_tensors(spec)
    length = max(math.prod(s) for _, s in shapes)
    b.axis("L", length, "flat", reason="lanes are independent: padded lanes are computed and discarded")
    for role, shape in shapes:
        n = math.prod(shape)
        if n == length:
            b.tensor(role, shape, ("L",), FLAT, values={"L": "0"})
        else:  # a broadcast operand: its own flat buffer
            axis = b.axis(f"L_{role}", n, "flat", reason="broadcast operand: its own buffer, padded at the end")
            b.tensor(role, shape, (axis,), FLAT, values={axis: "0"})
    return b.problem()


def _softmax(spec: OpSpec, target: Any, b: _Builder) -> Problem:
    name = target._schema.name.split("::")[-1]
    prim = primary_arg(target)
    shape = spec.inputs[prim]
    d = _dim(spec, int(_arg(spec, target, "dim")), len(shape))
    rows, length, lanes = math.prod(shape[:d]), (shape[d] if shape else 1), math.prod(shape[d + 1:])
    log = "log" in name
    b.axis("R", rows, "rows", reason="an added row is a softmax of its own, discarded")
    if lanes == 1:
        b.axis("M", length, "columns", reason="exp(-inf) = 0: a -inf column leaves every row's denominator unchanged; "
                                              "in backward the pads of grad and softmax output are 0 (of log-softmax output -inf), so every row sum is unchanged")
        cols: tuple[str, ...] = ("M",)
    else:
        b.axis("M", length * lanes, "columns", padable=False,
               reason="the softmax dim is not the last: a column would interleave with its lanes; rows only")
        cols = ("M",)
    for role, s in _all_tensors(spec):
        _check(spec, role, math.prod(s), rows * length * lanes, "element count")
        if name in SOFTMAX:
            value = "-inf" if role == prim else ("-inf" if log else "0")
        else:
            value = "-inf" if (role == "output" and log) else "0"
        b.tensor(role, s, ("R",) + cols, EITHER, (("R",), cols), {"R": "0", "M": value})
    return b.problem()


def _matmul(spec: OpSpec, target: Any, b: _Builder) -> Problem:
    name = target._schema.name.split("::")[-1]
    rows = "added rows of the left operand give added output rows, discarded"
    inner = "zero columns of the left operand meet zero rows of the right one: every added product is 0"
    cols = "added columns of the right operand give added output columns, discarded"
    batched = name in ("bmm", "baddbmm")
    left = {"mm": "self", "addmm": "mat1", "bmm": "self", "baddbmm": "batch1", "linear": "input"}[name]
    right = {"mm": "mat2", "addmm": "mat2", "bmm": "mat2", "baddbmm": "batch2", "linear": "weight"}[name]
    a = spec.inputs[left]
    if name == "linear":
        if not a:
            raise AlignError(f"op '{spec.id}' ({spec.op}): tensor '{left}' must have at least 1 dimension")
        lead = ("B",)
        b.axis("B", 1, "batch", padable=False)
        b.axis("M", math.prod(a[:-1]), "rows", reason=rows)
    else:
        _need_rank(spec, left, a, (3,) if batched else (2,))
        lead = ("B",) if batched else ()
        if batched:
            b.axis("B", a[0], "batch", padable=False, reason="batch of independent products")
        b.axis("M", a[-2], "rows", reason=rows)
    b.axis("K", a[-1], "columns", reason=inner)
    mk = lead + ("M", "K")
    rule = EITHER if b.matmul_rule == "dma" else ALL  # tensor_core: every named axis of each operand
    b.tensor(left, a, mk, rule, (("M",), ("K",)), {"M": "0", "K": "0"})
    w = spec.inputs.get(right)
    if w is not None:
        if name == "linear":
            _need_rank(spec, right, w, (2,))
            b.axis("N", w[0], "output columns", reason=cols)
            b.axis("K", w[1], "columns")
            b.tensor(right, w, ("N", "K"), rule, (("N",), ("K",)), {"N": "0", "K": "0"})
        else:
            _need_rank(spec, right, w, (3,) if batched else (2,))
            if batched:
                b.axis("B", w[0], "batch", padable=False)
            b.axis("K", w[-2], "columns")
            b.axis("N", w[-1], "output columns", reason=cols)
            b.tensor(right, w, lead + ("K", "N"), rule, (("K",), ("N",)), {"K": "0", "N": "0"})
    for role, s in [(r, s) for r, s in spec.inputs.items() if r not in (left, right)] + list(spec.outputs.items()):
        if "N" not in b.axes:
            b.axis("N", s[-1], "output columns", reason=cols)
        if math.prod(s) == b.axes["N"].size:  # a bias row
            b.tensor(role, s, ("N",), FLAT, values={"N": "0"})
        else:
            b.tensor(role, s, lead + ("M", "N"), rule, (("M",), ("N",)), {"M": "0", "N": "0"})
    return b.problem()


def _pool(spec: OpSpec, target: Any, b: _Builder) -> Problem:
    name = target._schema.name.split("::")[-1]
    is_max = name.startswith("max")
    n_reason = "an added sample is pooled on its own, discarded"
    for role, s in _all_tensors(spec):
        _need_rank(spec, role, s, (4,))
    shapes = _all_tensors(spec)
    b.axis("N", shapes[0][1][0], "rows", reason=n_reason)
    for role, s in shapes:
        is_input = role == "self" or (role == "out0" and name.endswith("backward"))
        w = "W_in" if is_input else "W_out"
        if is_input and is_max:
            b.axis(w, s[3], "columns", reason="a -inf column is never the maximum of a window (indices are remapped to the padded width)")
        elif is_input:
            b.axis(w, s[3], "columns", padable=False, reason="a zero column inside a window changes its average: rows only")
        else:
            b.axis(w, s[3], "columns", reason="added output columns are written and discarded")
        ch = b.axis(f"CH_{role}", s[1] * s[2], "channels x rows", padable=False)
        value = "-inf" if (role == "self" and is_max) else "0"
        b.tensor(role, s, ("N", ch, w), EITHER, (("N",), (w,)), {"N": "0", w: value})
    return b.problem()


def _batch_norm(spec: OpSpec, target: Any, b: _Builder) -> Problem:
    name = target._schema.name.split("::")[-1]
    prim = primary_arg(target)
    x = spec.inputs[prim]
    if len(x) < 2:
        raise AlignError(f"op '{spec.id}' ({spec.op}): tensor '{prim}' has shape {list(x)}, expected (N, C, ...)")
    training = name != "_native_batch_norm_legit_no_training" and bool(
        _arg(spec, target, "train" if "backward" in name else "training"))
    n, c, hw = x[0], x[1], math.prod(x[2:])
    if training:  # seed s3: n, c, h*w with c and h*w aligned
        b.axis("N", n, "batch", padable=False, reason="statistics run over the batch")
        b.axis("C", c, "channels", reason="channels are normalised independently: an added zero channel (weight and bias 0) gives 0, discarded")
        b.axis("HW", hw, "spatial", reason="masked: zero pads add nothing to the sums (x, x^2, grad, grad*x) and the statistics divide by the real count N*H*W")
        rule, groups, values = ALL, (("C",), ("HW",)), {"C": "0", "HW": "0 (masked)"}
    else:  # seed s2: rows (samples) or one column after each h*w
        b.axis("N", n, "rows", reason="eval batch norm is per element: an added sample is discarded")
        b.axis("C", c, "channels", padable=False)
        b.axis("HW", hw, "columns", reason="eval batch norm is per element: added lanes are discarded")
        rule, groups, values = EITHER, (("N",), ("HW",)), {"N": "0", "HW": "0"}
    for role, s in _all_tensors(spec):
        if math.prod(s) == c and len(s) <= 1:
            b.tensor(role, s, ("C",), FLAT, values={"C": "0"})
        else:
            _check(spec, role, math.prod(s), n * c * hw, "element count")
            b.tensor(role, s, ("N", "C", "HW"), rule, groups, values)
    return b.problem()


def _reduction(spec: OpSpec, target: Any, b: _Builder) -> Problem:
    name = target._schema.name.split("::")[-1]
    x = spec.inputs["self"]
    rank = len(x)
    has_dim = any(a.name == "dim" for a in target._schema.arguments)
    dims = _arg(spec, target, "dim") if has_dim else None
    dims = list(range(rank)) if dims is None or dims == [] else ([dims] if isinstance(dims, int) else list(dims))
    dims = sorted({_dim(spec, int(d), rank) for d in dims}) if rank else []
    value = REDUCTION[name]
    if dims and dims != list(range(dims[0], dims[-1] + 1)):
        for role, s in _all_tensors(spec):
            b.axis(f"T_{role}", math.prod(s), "flat", padable=False)
            b.tensor(role, s, (f"T_{role}",), FLAT)
        return b.problem("reduced dims are not contiguous: no neutral layout")
    lo, hi = (dims[0], dims[-1] + 1) if dims else (0, 0)
    a, r, c = math.prod(x[:lo]), math.prod(x[lo:hi]), math.prod(x[hi:])
    kept = "kept lanes are reduced on their own, discarded"
    b.axis("A", a, "rows", reason=kept)
    reason = {"0": "0 adds nothing to a sum", "0 (rescaled)": "zero pads add nothing to the sum; the mean divides by the real count (padded mean x padded/real)",
              "-inf": "-inf is never the maximum", "+inf": "+inf is never the minimum"}[value]
    b.axis("R", r, "reduced", reason=reason)
    b.axis("C", c, "columns", reason=kept)
    groups = (("A",), ("R",)) if c == 1 else ((("R",), ("C",)) if a == 1 else (("A", "R"), ("C",)))
    b.tensor("self", x, ("A", "R", "C"), EITHER, groups, {"A": "0", "R": value, "C": "0"})
    for role, s in spec.outputs.items():
        _check(spec, role, math.prod(s), a * c, "element count")
        out_groups = (("A",), ("C",)) if a > 1 and c > 1 else ()
        b.tensor(role, s, ("A", "C"), EITHER if out_groups else FLAT, out_groups, {"A": "0", "C": "0"})
    return b.problem()


def _attention(spec: OpSpec, target: Any, b: _Builder) -> Problem:
    q_role = primary_arg(target)
    q = spec.inputs[q_role]
    _need_rank(spec, q_role, q, (4,))
    masked = "attn_mask" in spec.inputs
    causal = bool(spec.args.get("is_causal", False))
    seq = ("added keys get -inf in the mask (added query rows 0); added queries are discarded" if masked else
           "an added query at the end is discarded; an added key at the end comes after every real query, so the causal mask hides it")
    b.axis("BH", q[0] * q[1], "batch", padable=False)
    b.axis("L", q[2], "rows", padable=masked or causal,
           reason=seq if masked or causal else "no mask: an added key would change every softmax")
    b.axis("D", q[3], "columns", reason="zero head-dim entries add 0 to every q.k and give added output columns, "
                                         "discarded; the scale is passed as 1/sqrt(real head dim)")
    for role, s in _all_tensors(spec):
        _need_rank(spec, role, s, (4,))
        if role == "attn_mask":
            _check(spec, role, s[2] * s[3], q[2] * q[2], "query x key positions")
            m = b.axis("BHm", s[0] * s[1], "batch", padable=False)
            b.tensor(role, s, (m, "L", "L"), EITHER, (("L",), ("L",)), {"L": "0 (query rows), -inf (key columns)"})
            continue
        _check(spec, role, s[0] * s[1], q[0] * q[1], "batch x heads")
        seq_axis = "L" if s[2] == q[2] else b.axis(f"L_{role}", s[2], "rows", padable=False)
        dv = "D" if s[3] == q[3] else b.axis(f"D_{role}", s[3], "columns", padable=False)
        b.tensor(role, s, ("BH", seq_axis, dv), EITHER, ((seq_axis,), (dv,)), {seq_axis: "0", dv: "0"})
    return b.problem()


def _convolution(spec: OpSpec, target: Any, b: _Builder) -> Problem:
    groups_ok = int(spec.args.get("groups", 1)) == 1 and not bool(spec.args.get("transposed", False))
    note = "" if groups_ok else "grouped or transposed convolution: channels are not independent: naive"
    backward = target._schema.name.endswith("backward")
    kinds = ({"grad_output": "out", "input": "in", "weight": "w", "out0": "in", "out1": "w", "out2": "vec"} if backward
             else {"input": "in", "weight": "w", "bias": "vec", "out0": "out"})
    spatial = "a spatial pad would enter the convolution windows"
    cin = "a zero input channel meets zero weights: it adds 0 to every output"
    cout = "an added output channel (zero weights and bias) is discarded"
    for role, s in _all_tensors(spec):
        kind = kinds.get(role, "vec")
        _need_rank(spec, role, s, (1,) if kind == "vec" else (3, 4, 5))
        if kind == "vec":
            b.axis("Cout", s[0], "output channels", groups_ok, cout)
            b.tensor(role, s, ("Cout",), FLAT, values={"Cout": "0"})
        elif kind == "w":
            b.axis("Cout", s[0], "output channels", groups_ok, cout)
            b.axis("Cin", s[1], "channels", groups_ok, cin)
            b.axis("K", math.prod(s[2:]), "kernel taps", False, spatial)
            b.tensor(role, s, ("Cout", "Cin", "K"), EITHER, (("Cout",), ("Cin", "K")), {"Cout": "0", "Cin": "0"})
        else:
            ch, sp = ("Cin", "HWin") if kind == "in" else ("Cout", "HWout")
            b.axis("N", s[0], "batch", False, "samples are independent but the channel rule does not involve them")
            b.axis(ch, s[1], "channels" if kind == "in" else "output channels", groups_ok, cin if kind == "in" else cout)
            b.axis(sp, math.prod(s[2:]), "spatial", False, spatial)
            b.tensor(role, s, ("N", ch, sp), EITHER, ((ch,), (sp,)), {ch: "0"})
    return b.problem(note)


def _embedding(spec: OpSpec, target: Any, b: _Builder) -> Problem:
    rows = "added table rows are never indexed"
    cols = "added columns are gathered and discarded"
    for role, s in _all_tensors(spec):
        if not s:
            raise AlignError(f"op '{spec.id}' ({spec.op}): tensor '{role}' must have at least 1 dimension")
        table = role == "weight" or (role == "out0" and target._schema.name.endswith("backward"))
        e = b.axis("E", s[-1], "columns", reason=cols)
        if table:
            _need_rank(spec, role, s, (2,))
            b.axis("V", s[0], "rows", reason=rows)
            b.tensor(role, s, ("V", e), EITHER, (("V",), (e,)), {"V": "0", e: "0"})
        else:
            b.axis("T", math.prod(s[:-1]), "rows", padable=False, reason="one row per index")
            b.tensor(role, s, ("T", e), EITHER, (("T",), (e,)), {e: "0"})
    return b.problem()


def _concat(spec: OpSpec, target: Any, b: _Builder) -> Problem:
    first = spec.inputs[primary_arg(target)]
    d = _dim(spec, int(_arg(spec, target, "dim")), len(first))
    a = math.prod(first[:d])
    b.axis("A", a, "rows", padable=a > 1, reason="an added row of every input gives an added output row, discarded")
    for role, s in _all_tensors(spec):
        _check(spec, role, math.prod(s[:d]), a, "rows before the concat dim")
        col = b.axis(f"M_{role}", math.prod(s[d:]), "columns", padable=False, reason="the concat dim interleaves the inputs")
        b.tensor(role, s, ("A", col), EITHER, (("A",), (col,)), {"A": "0"})
    return b.problem("" if a > 1 else "concat along the first dim: inputs are whole blocks, no neutral layout")


def _view(spec: OpSpec, target: Any, b: _Builder) -> Problem:
    return b.problem("an alias: no data moves; the op that reads the data pads it")


def _naive(spec: OpSpec, target: Any, b: _Builder) -> Problem:
    for role, s in _all_tensors(spec):
        b.axis(f"T_{role}", math.prod(s), "flat", padable=False)
        b.tensor(role, s, (f"T_{role}",), FLAT)
    return b.problem("no class: no neutral layout is known, every dimension is padded")


BUILDERS: dict[str, Callable[[OpSpec, Any, _Builder], Problem]] = {
    "elementwise": _elementwise, "softmax": _softmax, "matmul": _matmul, "pool": _pool, "batch_norm": _batch_norm,
    "reduction": _reduction, "attention": _attention, "convolution": _convolution, "embedding": _embedding,
    "concat": _concat, "view": _view, "naive": _naive,
}


def build_problem(spec: OpSpec, matmul_rule: str = "dma") -> Problem:
    """The padding problem of one op (matmuls under ``matmul_rule``, one of MATMUL_RULES); an unknown op or
    rule, or a shape that does not fit the op, raises AlignError."""
    where = f"op '{spec.id}': "
    if matmul_rule not in MATMUL_RULES:
        raise AlignError(f"{where}matmul rule '{matmul_rule}' is not one of {', '.join(MATMUL_RULES)}")
    target = resolve(spec.op, where)
    cls = classify(target)
    prim = primary_arg(target)
    if prim not in spec.inputs:
        raise AlignError(f"{where}({spec.op}) needs the shape of its tensor '{prim}'")
    for role, shape in _all_tensors(spec):
        if not isinstance(shape, tuple) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
            raise AlignError(f"{where}({spec.op}) tensor '{role}': bad shape {list(shape) if isinstance(shape, tuple) else shape!r} "
                             "(a list of positive integers)")
    return BUILDERS[cls](spec, target, _Builder(spec, cls, matmul_rule))
