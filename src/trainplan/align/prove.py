"""Padded execution of whole training steps: every half-precision op runs on its padded tensors as planned.

``PaddedInterpreter`` runs a traced step at per-op precision (the overflow stage's interpreter); for each
half-precision op it also runs the op padded (``execute.run_padded``) and compares with the unpadded
result (first occurrence of each distinct op, shapes and arguments). With ``feed_padded`` the padded
result (unpadded back) is what flows on, so the step's loss and gradients come from padded ops only.
With ``timing`` (repeats, warm-up) it also times the padding copies, ours vs naive, on the real inputs; with
``speed`` (an ``OpClock``) each distinct padded op is also timed plain, on its aligned shapes and padded
(``speed.op_speed``). ``emulate_matmul`` False runs fp16 matmuls on the device's own kernels (on a GPU, for
its speed) instead of with fp32 accumulation.
"""

from __future__ import annotations

import math
import operator
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from trainplan.align.classes import build_problem
from trainplan.align.cost import padding_times
from trainplan.align.execute import compare, emulated_call, native_call, run_padded
from trainplan.align.graph import HALF_DTYPES, op_spec
from trainplan.align.plan import strategy_name
from trainplan.align.problem import solve
from trainplan.align.speed import OpClock, op_speed
from trainplan.align.units import element_size, quantum
from trainplan.precision.interpreter import PrecisionInterpreter, _cast_args, _kept_args
from trainplan.timing import gc_paused


@dataclass
class OpProof:
    """Padded vs unpadded result of one distinct (op, shapes, args), and its padding-copy times."""

    node: str
    op: str
    cls: str
    strategy: str
    signature: str
    padded: bool
    identical: bool
    within_tolerance: bool
    max_abs_error: float
    max_error_over_bound: float
    occurrences: int
    check_s: float
    pad_s_ours: float
    pad_s_naive: float
    plain_s: float = math.nan
    aligned_s: float = math.nan
    padded_run_s: float = math.nan


def _signature(spec: Any) -> str:
    return f"{spec.op}|{sorted(spec.inputs.items())}|{sorted(spec.outputs.items())}|{sorted(spec.args.items(), key=str)}"


def _tensors(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _clone(value: Any) -> Any:
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, value)


class PaddedInterpreter(PrecisionInterpreter):
    """Precision interpreter that also runs every half-precision op padded and records the comparison."""

    def __init__(self, gm: torch.fx.GraphModule, dtypes: dict[str, torch.dtype], granularity: int, *,
                 feed_padded: bool, timing: tuple[int, int] | None = None, emulate_matmul: bool = True,
                 speed: OpClock | None = None, matmul_rule: str = "dma") -> None:
        super().__init__(gm, dtypes, emulate_matmul=emulate_matmul)
        self.granularity, self.feed_padded, self.timing, self.speed = granularity, feed_padded, timing, speed
        self.matmul_rule = matmul_rule
        self.call = emulated_call if emulate_matmul else native_call
        self.proofs: dict[str, OpProof] = {}
        self.padded_ops = 0

    def run_node(self, n: torch.fx.Node) -> Any:
        dtype = self.dtypes.get(n.name)
        if n.op != "call_function" or dtype not in HALF_DTYPES or n.target is operator.getitem:
            return super().run_node(n)
        spec = op_spec(n, dtype)
        problem = build_problem(spec, self.matmul_rule)
        if problem.cls == "view" or not problem.tensors:
            return super().run_node(n)
        q = quantum(self.granularity, element_size(spec.dtype))
        solution = solve(problem, q)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        args, kwargs = _cast_args(args, kwargs, dtype, _kept_args(n), False)
        names = [a.name for a in n.target._schema.arguments]
        bound = _clone({**dict(zip(names, args)), **kwargs})
        value = super().run_node(n)
        key = _signature(spec)
        padded = bool(solution.padded)
        proof = self.proofs.get(key)
        if proof is None:
            strategy = "naive" if solution.padded is None else strategy_name(problem, solution.padded)
            ours_s, naive_s = padding_times(bound, problem, solution.padded, q, *self.timing) if self.timing else (0.0, 0.0)
            proof = self.proofs[key] = OpProof(n.name, spec.op, problem.cls, strategy, key, padded, not padded,
                                               not padded and solution.padded is not None, 0.0, 0.0, 0, 0.0, ours_s, naive_s)
        proof.occurrences += 1
        if not padded:
            return value
        start = time.perf_counter()
        out_shapes = [tuple(v.shape) for v in _tensors(value) if isinstance(v, torch.Tensor)]
        if proof.occurrences == 1 and self.speed is not None:
            t = op_speed(n.target, bound, problem, solution.padded, out_shapes, self.speed)
            proof.plain_s, proof.aligned_s, proof.padded_run_s = t.plain_s, t.aligned_s, t.padded_run_s
        result = run_padded(n.target, bound, problem, solution.padded, out_shapes, call=self.call)
        self.padded_ops += 1
        if proof.occurrences == 1:
            c = compare(result, value)
            proof.identical, proof.within_tolerance = c.identical, c.within_tolerance
            proof.max_abs_error, proof.max_error_over_bound = c.max_abs_error, c.max_error_over_bound
            proof.check_s = time.perf_counter() - start
        if self.feed_padded:  # the padded results, in the plain outputs' own tensors (strides, in-place targets)
            for v, r in zip(_tensors(value), _tensors(result)):
                if isinstance(v, torch.Tensor):
                    v.copy_(r)
        return value


def proof_rows(interp: PaddedInterpreter) -> list[dict[str, Any]]:
    """One row per distinct op of the run (plain dicts for a table)."""
    return [asdict(p) for p in interp.proofs.values()]


def run_padded_step(gm: torch.fx.GraphModule, flat: list[torch.Tensor], dtypes: dict[str, torch.dtype],
                    granularity: int, *, feed_padded: bool = True, timing: tuple[int, int] | None = None,
                    emulate_matmul: bool = True, speed: OpClock | None = None, matmul_rule: str = "dma",
                    ) -> tuple[Any, PaddedInterpreter]:
    """One training step with every half-precision op padded as planned; returns ``(loss, *grads)`` and the interpreter."""
    with torch.no_grad(), gc_paused():  # one collection for the step, not one per timed op
        interp = PaddedInterpreter(gm, dtypes, granularity, feed_padded=feed_padded, timing=timing,
                                   emulate_matmul=emulate_matmul, speed=speed, matmul_rule=matmul_rule)
        return interp.run(*flat), interp
