"""The seed's loop: S1 detect, S2 root cause, S3 deny-list the roots, rerun until no overflow remains."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from trainplan.export.trace import TracedStep
from trainplan.precision.assign import assign_precision, fp32_dtypes, sentinel_nodes
from trainplan.precision.detect import Finding, OverflowDetector, analyse
from trainplan.precision.interpreter import Injection, run_step
from trainplan.precision.policy import Policy


@dataclass
class IterationResult:
    """One S1-S3 pass: what was found under ``policy`` and the policy for the next pass."""

    iteration: int
    policy: Policy
    findings: list[Finding]
    next_policy: Policy
    loss: float
    inherent: list[str]

    @property
    def roots(self) -> list[str]:
        """S2 roots (node names), in execution order."""
        return [f.node for f in self.findings if f.is_root]

    @property
    def clean(self) -> bool:
        """No op saw or produced an overflow value in this pass."""
        return not self.findings

    @property
    def stalled(self) -> bool:
        """Overflow remains but S2 found no root to deny (e.g. bad values in the inputs themselves)."""
        return bool(self.findings) and not self.roots

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary of the pass (the iteration artifact)."""
        return {
            "iteration": self.iteration,
            "clean": self.clean,
            "stalled": self.stalled,
            "converged": self.clean or self.stalled,
            "loss": self.loss,
            "n_recorded": len(self.findings),
            "n_recorded_forward": sum(f.phase == "forward" for f in self.findings),
            "n_recorded_backward": sum(f.phase == "backward" for f in self.findings),
            "roots": self.roots,
            "root_ops": [f.op for f in self.findings if f.is_root],
            "deny_nodes": list(self.next_policy.deny_nodes),
            "inherent": self.inherent,
            "findings": [f.to_dict() for f in self.findings],
        }


def inherent_bad_nodes(traced: TracedStep, flat: list[torch.Tensor], injections: dict[str, Injection] | None = None) -> list[str]:
    """Nodes whose values are NaN/inf in the all-fp32 step: no precision choice can fix them."""
    detector = OverflowDetector(sentinel_nodes(traced.gm))
    run_step(traced.gm, flat, fp32_dtypes(traced.gm), injections, observer=detector)
    return detector.bad_nodes()


def run_iteration(
    traced: TracedStep,
    flat: list[torch.Tensor],
    policy: Policy,
    iteration: int = 0,
    injections: dict[str, Injection] | None = None,
    *,
    saturating: bool = False,
    emulate_matmul: bool = True,
    inherent: list[str] | None = None,
) -> IterationResult:
    """Run one real training step under ``policy`` and apply S1-S3 to it.

    ``inherent``: nodes bad in the all-fp32 step, ignored by S1 (computed with an extra fp32 run when None).
    ``saturating`` / ``emulate_matmul``: see PrecisionInterpreter.
    """
    if inherent is None:
        inherent = inherent_bad_nodes(traced, flat, injections)
    assignment = assign_precision(traced.gm, policy, traced.loss_node)
    detector = OverflowDetector(sentinel_nodes(traced.gm), set(inherent))
    out = run_step(traced.gm, flat, assignment.dtype, injections, saturating=saturating, emulate_matmul=emulate_matmul, observer=detector)
    findings = analyse(traced.gm, detector.checks, assignment.dtype, assignment.phase)
    roots = [f.node for f in findings if f.is_root]
    next_policy = policy.with_denied_nodes(roots, name=f"{policy.name.split('+')[0]}+iter{iteration + 1}")
    return IterationResult(iteration, policy, findings, next_policy, float(out[0].float()), inherent)


@dataclass
class FixResult:
    """All passes of the loop and the final policy."""

    iterations: list[IterationResult] = field(default_factory=list)

    @property
    def final_policy(self) -> Policy:
        """Policy after the last pass (its roots added to deny)."""
        return self.iterations[-1].next_policy

    @property
    def converged(self) -> bool:
        """The last pass found no overflow."""
        return bool(self.iterations) and self.iterations[-1].clean

    @property
    def denied(self) -> list[str]:
        """Nodes the loop added to deny, in the order found."""
        return [r for it in self.iterations for r in it.roots]


def fix_overflow(
    traced: TracedStep,
    flat: list[torch.Tensor],
    policy: Policy,
    injections: dict[str, Injection] | None = None,
    *,
    max_iterations: int = 8,
    saturating: bool = False,
    emulate_matmul: bool = True,
) -> FixResult:
    """Iterate S1-S3 in process until a pass is clean, no root can be found, or ``max_iterations``."""
    result = FixResult()
    inherent = inherent_bad_nodes(traced, flat, injections)
    for i in range(max_iterations):
        it = run_iteration(traced, flat, policy, i, injections, saturating=saturating, emulate_matmul=emulate_matmul, inherent=inherent)
        result.iterations.append(it)
        if it.clean or it.stalled:
            break
        policy = it.next_policy
    return result
