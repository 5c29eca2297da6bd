"""S1 overflow detection and S2 root-cause analysis over one run of the training step.

S1 records, per op, whether its inputs (its producers' values) or its outputs hold NaN, +-inf or, in
fp16 tensors, +-65504 (a saturated fp16 value; CPUs give inf, saturating hardware 65504, so both are
checked). S2 applies the seed's conservative rule: an op whose inputs hold such values is never
blamed (blame moves to its producers); an op with clean inputs and bad outputs is a root.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from trainplan.precision.interpreter import FP16_MAX
from trainplan.precision.policy import op_keys


@dataclass
class ValueCheck:
    """Bad-value counts and the finite range of one node's value (all its floating tensors)."""

    nan: int = 0
    pos_inf: int = 0
    neg_inf: int = 0
    pos_sat: int = 0  # elements equal to +65504 in fp16 tensors
    neg_sat: int = 0
    finite_min: float = float("nan")
    finite_max: float = float("nan")
    exempt_negative: bool = False  # attention-mask sentinel: -inf / -65504 are intended

    @property
    def bad(self) -> bool:
        """True when the value holds NaN, +-inf or +-65504 (negative side ignored for mask sentinels)."""
        positive = self.nan + self.pos_inf + self.pos_sat
        return bool(positive or (not self.exempt_negative and self.neg_inf + self.neg_sat))


def _tensors(value: Any) -> list[torch.Tensor]:
    vals = value if isinstance(value, (tuple, list)) else [value]
    return [v for v in vals if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 0]


def check_value(value: Any, exempt_negative: bool = False) -> ValueCheck:
    """Count bad elements of a node value; a fast min/max pass skips clean tensors."""
    check = ValueCheck(exempt_negative=exempt_negative)
    lows, highs = [], []
    for t in _tensors(value):
        lo, hi = (float(x) for x in torch.aminmax(t.detach()))
        limit = FP16_MAX if t.dtype == torch.float16 else float("inf")
        if -limit < lo and hi < limit:  # False for NaN too
            lows.append(lo)
            highs.append(hi)
            continue
        f = t.detach().float()  # fp32 kernels are much faster than fp16 ones on CPU
        nan_mask, inf_mask = torch.isnan(f), torch.isinf(f)
        nan, n_inf = int(torch.count_nonzero(nan_mask)), int(torch.count_nonzero(inf_mask))
        pos_inf = int(torch.count_nonzero(f == float("inf"))) if n_inf else 0
        check.nan, check.pos_inf, check.neg_inf = check.nan + nan, check.pos_inf + pos_inf, check.neg_inf + n_inf - pos_inf
        if t.dtype == torch.float16:
            check.pos_sat += int(torch.count_nonzero(f == FP16_MAX))
            check.neg_sat += int(torch.count_nonzero(f == -FP16_MAX))
        finite = f[~(nan_mask | inf_mask)] if nan + n_inf else f
        if finite.numel():
            lo, hi = (float(x) for x in torch.aminmax(finite))
            lows.append(lo)
            highs.append(hi)
    if lows:
        check.finite_min, check.finite_max = min(lows), max(highs)
    return check


class OverflowDetector:
    """Observer for PrecisionInterpreter: keeps a ValueCheck per node (placeholders included).

    Nodes in ``ignore`` are not checked (treated as clean): values that are already NaN/inf in the
    all-fp32 step (e.g. T5's ``log(0)`` in its position buckets) are the model's, not fp16 overflow.
    """

    def __init__(self, exempt_negative: set[str] | None = None, ignore: set[str] | None = None) -> None:
        self.checks: dict[str, ValueCheck] = {}
        self.exempt = exempt_negative or set()
        self.ignore = ignore or set()

    def __call__(self, node: torch.fx.Node, value: Any) -> None:
        if node.name not in self.ignore:
            self.checks[node.name] = check_value(value, node.name in self.exempt)

    def bad_nodes(self) -> list[str]:
        """Names of checked nodes whose values are bad."""
        return [name for name, check in self.checks.items() if check.bad]


@dataclass
class Finding:
    """One S1 record: an op whose inputs or outputs hold overflow values, and the S2 verdict."""

    node: str
    op: str
    phase: str
    dtype: str
    bad_inputs: list[str]
    bad_output: bool
    is_root: bool
    nan: int
    pos_inf: int
    neg_inf: int
    pos_sat: int
    neg_sat: int
    finite_min: float
    finite_max: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping."""
        return asdict(self)


def analyse(gm: torch.fx.GraphModule, checks: dict[str, ValueCheck], dtypes: dict[str, torch.dtype], phases: dict[str, str]) -> list[Finding]:
    """S1 records and S2 roots: a root has a bad output and no producer with a bad value."""
    findings = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.name not in checks:
            continue
        bad_inputs = [a.name for a in node.all_input_nodes if a.name in checks and checks[a.name].bad]
        out = checks[node.name]
        if not (bad_inputs or out.bad):
            continue
        findings.append(
            Finding(
                node=node.name,
                op=op_keys(node)[0],
                phase=phases.get(node.name, ""),
                dtype=str(dtypes.get(node.name, "")).removeprefix("torch."),
                bad_inputs=bad_inputs,
                bad_output=out.bad,
                is_root=out.bad and not bad_inputs,
                nan=out.nan,
                pos_inf=out.pos_inf,
                neg_inf=out.neg_inf,
                pos_sat=out.pos_sat,
                neg_sat=out.neg_sat,
                finite_min=out.finite_min,
                finite_max=out.finite_max,
            )
        )
    return findings
