"""What a precision policy keeps in fp16 (ops, FLOPs) and what it costs (step time, activation bytes)."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_leaves

from trainplan.precision.assign import Assignment, is_floating
from trainplan.precision.interpreter import PrecisionInterpreter
from trainplan.precision.policy import op_keys


def precision_table(gm: torch.fx.GraphModule, assignment: Assignment, flops: dict[str, float]) -> pd.DataFrame:
    """One row per op node: op, phase, deciding list, dtype, whether it is floating, its FLOPs.

    ``flops`` comes from the export's nodes table; a node it lacks means the graphs differ (an error).
    """
    missing = [n.name for n in gm.graph.nodes if n.op == "call_function" and n.name not in flops]
    if missing:
        raise ValueError(f"nodes table has no FLOPs for op(s) {missing[:5]}: it was exported from a different graph")
    rows = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        rows.append(
            {
                "name": node.name,
                "op": op_keys(node)[0],
                "phase": assignment.phase[node.name],
                "list": assignment.source[node.name],
                "dtype": str(assignment.dtype[node.name]).removeprefix("torch."),
                "floating": is_floating(node),
                "flops": float(flops[node.name]),
            }
        )
    return pd.DataFrame(rows)


def fp16_shares(table: pd.DataFrame) -> dict[str, float]:
    """Fraction of floating ops, and of FLOPs, that run in fp16."""
    fl = table[table.floating]
    half = fl.dtype == "float16"
    total = float(table.flops.sum())
    return {
        "fp16_op_fraction": float(half.mean()) if len(fl) else 0.0,
        "fp16_flop_share": float(table.flops[table.dtype == "float16"].sum() / total) if total else 0.0,
        "n_fp16_ops": int(half.sum()),
        "n_floating_ops": len(fl),
    }


@dataclass
class StepCost:
    """Measured cost of one training step under a per-op dtype assignment."""

    step_time_s: float
    step_time_runs_s: list[float]
    activation_peak_bytes: int  # max over ops of live non-input storages (de-duplicated)
    saved_for_backward_bytes: int  # live non-input storages right after the loss op

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping."""
        return asdict(self)


class _LiveBytes:
    """on_step hook: bytes of the interpreter's live values that are not graph inputs, per storage."""

    def __init__(self, inputs: list[torch.Tensor], loss_node: str) -> None:
        self.fixed = {StorageWeakRef(t.untyped_storage()) for t in inputs}
        self.loss_node = loss_node
        self.peak = 0
        self.at_loss = 0

    def __call__(self, interp: PrecisionInterpreter, node: torch.fx.Node) -> None:
        seen: set[StorageWeakRef] = set()
        total = 0
        for t in tree_leaves(list(interp.env.values())):
            if not isinstance(t, torch.Tensor):
                continue
            ref = StorageWeakRef(t.untyped_storage())
            if ref in self.fixed or ref in seen:
                continue
            seen.add(ref)
            total += t.untyped_storage().nbytes()
        self.peak = max(self.peak, total)
        if node.name == self.loss_node:
            self.at_loss = total


def measure_steps(
    gm: torch.fx.GraphModule,
    flat: list[torch.Tensor],
    policies: dict[str, dict[str, torch.dtype]],
    loss_node: str,
    *,
    repeats: int = 3,
    warmup: int = 1,
    emulate_matmul: bool = True,
) -> dict[str, StepCost]:
    """Median step time of each per-op dtype assignment, and its activation bytes.

    Repetitions are interleaved (one step of every policy per round) so that all policies see the same
    machine load; every policy runs in the same interpreter, so only precision differs.
    """
    times: dict[str, list[float]] = {name: [] for name in policies}
    with torch.no_grad():
        for i in range(warmup + repeats):
            for name, dtypes in policies.items():
                start = time.perf_counter()
                PrecisionInterpreter(gm, dtypes, emulate_matmul=emulate_matmul).run(*flat)
                if i >= warmup:
                    times[name].append(time.perf_counter() - start)
        costs = {}
        for name, dtypes in policies.items():
            live = _LiveBytes(flat, loss_node)
            PrecisionInterpreter(gm, dtypes, emulate_matmul=emulate_matmul, on_step=live).run(*flat)
            costs[name] = StepCost(statistics.median(times[name]), times[name], live.peak, live.at_loss)
    return costs
