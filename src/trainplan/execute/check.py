"""Compare the executed step's loss and gradients with a reference step."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class OutputCheck:
    """Largest errors over all outputs, the output where the largest relative error is, and the verdict."""

    max_abs_err: float
    max_rel_err: float
    worst_output: str
    bit_exact: bool
    within_tolerance: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_outputs(got: list[torch.Tensor], ref: list[torch.Tensor], names: list[str], *, rtol: float,
                    atol: float) -> OutputCheck:
    """Max abs error, max error relative to each reference's largest magnitude, and ``allclose`` per output."""
    if len(got) != len(ref):
        raise ValueError(f"{len(got)} outputs executed, {len(ref)} expected")
    max_abs, max_rel, worst, exact, ok = 0.0, 0.0, names[0] if names else "", True, True
    for name, g, r in zip(names, got, ref):
        g, r = g.detach().float().cpu(), r.detach().float().cpu()
        err = float((g - r).abs().max()) if r.numel() else 0.0
        rel = err / max(float(r.abs().max()) if r.numel() else 0.0, 1e-30)
        max_abs = max(max_abs, err)
        if rel > max_rel or (rel == max_rel and err > 0):
            max_rel, worst = rel, name
        exact &= bool(torch.equal(g, r))
        ok &= bool(torch.allclose(g, r, rtol=rtol, atol=atol))
    return OutputCheck(max_abs, max_rel, worst, exact, ok)
