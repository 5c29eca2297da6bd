"""Measure each op of a traced training step: median time over repetitions after warm-up, plus recompute cost."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd
import torch
from torch.fx.node import map_arg
from tqdm import tqdm

from trainplan.aten_ops import is_inplace
from trainplan.errors import ArtifactError
from trainplan.export.trace import TracedStep, trace_training_step
from trainplan.models import BuiltModel, on_device
from trainplan.numerics import EXACT_FP32, exact_fp32
from trainplan.profile.link import host_link_bytes_per_s
from trainplan.profile.op_run import values_freed_after
from trainplan.profile.workspace import op_workspaces
from trainplan.timing import gc_paused, keep_freed_memory, live_objects_frozen


@dataclass
class ProfileResult:
    """Per-op timings (seconds) and the whole-step timing they are checked against."""

    ops: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)


def _sync_fn(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def timed_run(
    gm: torch.fx.GraphModule, inputs: list[torch.Tensor], sync: Callable[[], None], keep_values: bool
) -> tuple[dict[str, int], dict[torch.fx.Node, Any]]:
    """Run the graph op by op; an op's time includes freeing the values it used last (unless ``keep_values``)."""
    env: dict[torch.fx.Node, Any] = {}
    feed = iter(inputs)
    last_uses = values_freed_after(gm.graph)
    times: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(feed)
            continue
        if node.op == "get_attr":
            env[node] = getattr(gm, str(node.target))
            continue
        if node.op == "output":
            break
        sync()
        start = time.perf_counter_ns()
        args, kwargs = map_arg((node.args, node.kwargs), env.__getitem__)
        env[node] = node.target(*args, **kwargs)
        del args, kwargs
        if not keep_values:
            for dead in last_uses.get(node, []):
                env.pop(dead, None)
        sync()
        times[node.name] = time.perf_counter_ns() - start
    return times, env


def _time_recompute(gm: torch.fx.GraphModule, env: dict[torch.fx.Node, Any], names: set[str], sync: Callable[[], None]) -> dict[str, int]:
    """Re-run each named forward op on its saved inputs, as recomputation would, and time it."""
    out: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.name not in names:
            continue
        args, kwargs = map_arg((node.args, node.kwargs), env.__getitem__)
        sync()
        start = time.perf_counter_ns()
        node.target(*args, **kwargs)
        sync()
        out[node.name] = time.perf_counter_ns() - start
    return out


def profile_step(
    traced: TracedStep,
    flat: list[torch.Tensor],
    recompute_ops: list[str],
    *,
    repeats: int = 5,
    warmup: int = 1,
    device: str = "cpu",
    progress: bool = True,
) -> ProfileResult:
    """Median per-op times, recompute times of ``recompute_ops``, the median time of the whole compiled step,
    and each op's workspace (``workspace_measured_bytes``: bytes held during its call beyond what it leaves,
    :mod:`trainplan.profile.workspace`, from one more op-by-op run after the timed ones).

    ``time_op_s`` is an op's median time run op by op (with a clock around each); ``time_s`` is that time
    scaled by ``time_scale`` = whole step / sum of ``time_op_s``, so that the op times add up to the step as
    compiled code runs it, where a compiled plan (``execute.compile``) runs its ops: the fixed cost of the
    op-by-op run is taken out and what the compiled code costs beyond the op kernels is put in.

    Each repetition runs the compiled step, then the op-by-op run, then (on kept values) the recompute run,
    so the three see the same machine state, each with the cyclic GC paused; the first ``warmup``
    repetitions are discarded.
    """
    dev = torch.device(device)
    sync = _sync_fn(dev)
    inputs = [t.detach().to(dev) for t in flat]
    gm = traced.gm.to(dev)
    names = set(recompute_ops)
    step_ns: list[int] = []
    op_ns: dict[str, list[int]] = {}
    rec_ns: dict[str, list[int]] = {}
    with torch.no_grad(), live_objects_frozen():  # the model's and torch's objects out of each collection
        for i in tqdm(range(warmup + repeats), desc=f"profile {traced.model}", disable=not progress):
            with gc_paused():
                sync()
                start = time.perf_counter_ns()
                gm(*inputs)
                sync()
                whole = time.perf_counter_ns() - start
            with gc_paused():
                times = timed_run(gm, inputs, sync, keep_values=False)[0]
            with gc_paused():
                _, env = timed_run(gm, inputs, sync, keep_values=True)
                recompute = _time_recompute(gm, env, names, sync)
                del env
            if i < warmup:
                continue
            step_ns.append(whole)
            for name, ns in times.items():
                op_ns.setdefault(name, []).append(ns)
            for name, ns in recompute.items():
                rec_ns.setdefault(name, []).append(ns)
        workspaces = op_workspaces(gm, inputs, dev)
    ops = pd.DataFrame(
        [
            {
                "name": name,
                "time_op_s": statistics.median(ns) / 1e9,
                "time_mean_s": statistics.fmean(ns) / 1e9,
                "time_min_s": min(ns) / 1e9,
                "recompute_s": statistics.median(rec_ns[name]) / 1e9 if name in rec_ns else float("nan"),
                "workspace_measured_bytes": workspaces.get(name, 0),
            }
            for name, ns in op_ns.items()
        ]
    )
    step_s = statistics.median(step_ns) / 1e9
    op_sum = float(ops.time_op_s.sum())
    # a plan runs as compiled code (execute.compile), as the whole step does: op times in that runtime
    ops.insert(1, "time_s", ops.time_op_s * (step_s / op_sum))
    summary = {
        "model": traced.model,
        "device": str(dev),
        "repeats": repeats,
        "warmup": warmup,
        "threads": torch.get_num_threads(),
        "step_time_s": step_s,
        "step_time_runs_s": [ns / 1e9 for ns in step_ns],
        "op_sum_s": op_sum,
        "op_sum_over_step": op_sum / step_s,
        "time_scale": step_s / op_sum,
        "torch": torch.__version__,
    }
    return ProfileResult(ops, summary)


def profile_nodes(traced: TracedStep, flat: list[torch.Tensor], nodes: pd.DataFrame, *, repeats: int, warmup: int,
                  device: str = "cpu", progress: bool = True) -> ProfileResult:
    """:func:`profile_step` of ``traced`` (whose op table is ``nodes``, from ``graph_tables``), timing the
    recompute of every forward op that is neither a view nor in place; ``ops`` starts with the nodes'
    ``node_id``, ``name`` and ``phase``."""
    recompute = nodes.loc[(nodes.phase == "forward") & ~nodes.is_view & ~nodes.op.map(is_inplace), "name"]
    result = profile_step(traced, flat, recompute.tolist(), repeats=repeats, warmup=warmup, device=device,
                          progress=progress)
    result.ops = nodes[["node_id", "name", "phase"]].merge(result.ops, on="name", validate="one_to_one")
    return result


def profile_model(
    built: BuiltModel,
    nodes: pd.DataFrame,
    *,
    device: dict[str, Any],
    repeats: int,
    warmup: int,
    progress: bool = True,
) -> ProfileResult:
    """Trace ``built`` again on the device, check it matches the exported ``nodes``, and profile it.

    Adds ``transfer_s`` = bytes the op allocates / the host-link bandwidth of ``device`` (configured or
    measured, see ``host_link_bytes_per_s``). Keeps freed host memory for the rest of the process
    (``keep_freed_memory``), as the validation does, so both time the same steady state.
    """
    allocator = keep_freed_memory()
    traced, flat = trace_training_step(on_device(built, device["type"]))
    traced_names = [n.name for n in traced.gm.graph.nodes if n.op == "call_function"]
    if traced_names != nodes["name"].tolist():
        raise ArtifactError(
            f"model '{built.name}': the traced graph ({len(traced_names)} ops) differs from the exported one "
            f"({len(nodes)} ops); re-run the export for this device and torch version"
        )
    with exact_fp32():
        result = profile_nodes(traced, flat, nodes, repeats=repeats, warmup=warmup, device=device["type"],
                               progress=progress)
        bandwidth, source = host_link_bytes_per_s(device, nodes, repeats=repeats, warmup=warmup)
    result.ops["transfer_s"] = nodes["alloc_bytes"].to_numpy() / bandwidth
    result.summary["host_link_bytes_per_s"] = bandwidth
    result.summary["host_link"] = source
    result.summary["numerics"] = EXACT_FP32
    result.summary["host_allocator"] = allocator
    return result
