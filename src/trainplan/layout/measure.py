"""Measured costs of a conv graph in every layout: each conv's forward and backward, the ops of its group
replayed from its output, and the layout transforms on the tensors of every edge (forward conversion plus the
conversion of its gradient). Median of ``repeats`` after ``warmup``; the machine load is recorded with them.

``clock: process`` (the default) times with the process's CPU time (``time.process_time``): on a shared,
oversubscribed host it leaves out the time the process waits for a core, which wall time cannot; with one torch
thread it equals the single-thread run time (with more threads it also counts the OpenMP workers' spin-waiting,
so use ``threads: 1`` with it). ``clock: wall`` uses ``time.perf_counter``. On a CUDA device the clock is wall time
read after ``torch.cuda.synchronize`` (the process's CPU time does not see the GPU's work)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_map

from trainplan.clock import median_seconds, synced_clock
from trainplan.layout.graph import INPUT, ConvGraph, ConvInfo, Ref
from trainplan.timing import gc_paused, keep_freed_memory, live_objects_frozen

FORMATS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}


@dataclass(frozen=True)
class Timing:
    """How to time: median of ``repeats`` runs after ``warmup`` runs, on ``threads`` torch threads, by ``clock``
    (process: CPU time of the process; wall), with tensors on ``device`` (cpu, or cuda with the wall clock); each
    run makes ``calls`` back-to-back calls between two clock reads and counts their mean."""

    repeats: int = 5
    warmup: int = 1
    threads: int = 1
    clock: str = "process"
    device: str = "cpu"
    calls: int = 1

    def __post_init__(self) -> None:
        if self.clock not in ("process", "wall"):
            raise ValueError(f"layout timing: clock '{self.clock}' is not one of process, wall")
        if self.calls < 1:
            raise ValueError(f"layout timing: calls must be at least 1, not {self.calls}")
        if torch.device(self.device).type != "cpu" and self.clock != "wall":
            raise ValueError(f"layout timing on device '{self.device}' needs clock 'wall': the process's CPU time "
                             f"does not see the device's work")

    @property
    def now(self) -> Callable[[], float]:
        """The clock function; on a CUDA device it first waits for the device's queued work."""
        if torch.device(self.device).type == "cuda":
            return synced_clock(self.device)
        return time.process_time if self.clock == "process" else time.perf_counter


def memory_format(layout: str) -> torch.memory_format:
    """The torch memory format of a layout name (nchw or nhwc)."""
    if layout not in FORMATS:
        raise ValueError(f"layout '{layout}' cannot be executed by PyTorch (known: {sorted(FORMATS)})")
    return FORMATS[layout]


def device_facts(device: str) -> dict[str, Any]:
    """What the timings ran on: the device type, and on CUDA the GPU, the CUDA and cuDNN versions and the cuDNN
    settings in force (torch's defaults unless the caller changed them: TF32 convolutions on)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return {"type": dev.type}
    cudnn = torch.backends.cudnn
    return {"type": "cuda", "name": torch.cuda.get_device_name(dev), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": cudnn.version(), "cudnn_allow_tf32": cudnn.allow_tf32,
            "cudnn_benchmark": cudnn.benchmark, "cudnn_deterministic": cudnn.deterministic}


def load_average() -> float:
    """1-minute load average of the host (0 where unknown), stored beside timings taken under load."""
    try:
        return float(os.getloadavg()[0])
    except OSError:
        return 0.0


def median_time(fn: Callable[[], Any], timing: Timing) -> float:
    """Median time of one call of ``fn`` over ``timing.repeats`` runs of ``timing.calls`` back-to-back calls each
    (the run's time over its calls), after ``timing.warmup`` calls; GC paused."""
    return median_seconds(fn, timing.now, timing.repeats, timing.warmup, timing.calls)


def _fwd_bwd(forward: Callable[[], list[torch.Tensor]], timing: Timing) -> tuple[float, float]:
    """Median forward time, and median backward time of the outputs (graph kept, fixed ones as gradients)."""
    fwd = median_time(forward, timing)
    outs = [o for o in forward() if o.requires_grad]
    if not outs:
        return fwd, 0.0
    grads = [torch.ones_like(o) for o in outs]
    bwd = median_time(lambda: torch.autograd.backward(outs, grads, retain_graph=True), timing)
    return fwd, bwd


def conv_time(conv: ConvInfo, layout: str, timing: Timing, input_grad: bool = True, seed: int = 0) -> tuple[float, float]:
    """Forward and backward time of one conv's shapes with input, weight (and output) in ``layout``, on
    ``timing.device``."""
    fmt = memory_format(layout)
    dtype, dev = getattr(torch, conv.dtype), torch.device(timing.device)
    gen = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(conv.in_shape, generator=gen, dtype=dtype, device=dev).contiguous(memory_format=fmt)
    x.requires_grad_(input_grad)
    w = torch.randn(conv.weight_shape, generator=gen, dtype=dtype, device=dev).contiguous(memory_format=fmt)
    w.requires_grad_()
    b = torch.zeros(conv.weight_shape[0], dtype=dtype, device=dev, requires_grad=True) if conv.bias else None
    return _fwd_bwd(lambda: [F.conv2d(x, w, b, conv.stride, conv.padding, conv.dilation, conv.groups)], timing)


def conv_row(conv: ConvInfo, input_grad: bool = True) -> dict[str, Any]:
    """The table row describing a conv (the columns the predictor's features read); ``input_grad``: its
    backward computes the input's gradient (not for a conv reading the model's input)."""
    return {"conv": conv.id, "in_shape": list(conv.in_shape), "weight_shape": list(conv.weight_shape),
            "out_shape": list(conv.out_shape), "stride": list(conv.stride), "padding": list(conv.padding),
            "dilation": list(conv.dilation), "groups": conv.groups, "bias": conv.bias, "dtype": conv.dtype,
            "input_grad": input_grad}


def time_in_worker(shapes: list[ConvInfo], input_grad: list[bool], layouts: list[str], timing: Timing,
                   log: logging.Logger | None = None, progress_every: int = 0,
                   deadline: float | None = None) -> list[dict[str, Any]]:
    """Forward and backward time of every conv shape in every layout, timed in a worker process
    (``trainplan.layout.sweep_worker``): one row per shape (:func:`conv_row`, ``error``, ``fwd_``/``bwd_`` times).
    A shape PyTorch is known to crash on in one of ``layouts`` (:func:`known_crash`) is not run; one torch refuses,
    or one that kills its worker, keeps its row with ``error`` set and no times (after a crash a new worker goes on
    with the next shape). With a ``deadline`` (``time.time()`` seconds), no shape is started after it: the rows
    are those of the shapes before the first one left untimed."""
    known = {i: why for i, c in enumerate(shapes)
             if (why := "; ".join(w for lay in layouts if (w := known_crash(c, lay, timing.device))))}
    for i, why in known.items():
        if log is not None:
            log.warning("conv %s %s not run: %s", shapes[i].id, conv_row(shapes[i], input_grad[i]), why)
    run = [i for i in range(len(shapes)) if i not in known]
    timed = _run_worker([shapes[i] for i in run], [input_grad[i] for i in run], layouts, timing, log, progress_every,
                        deadline)
    rows = dict(zip(run, timed))
    rows.update({i: {**conv_row(shapes[i], input_grad[i]), "error": why} for i, why in known.items()})
    return [rows[i] for i in range(run[len(timed)] if len(timed) < len(run) else len(shapes))]


def _run_worker(shapes: list[ConvInfo], input_grad: list[bool], layouts: list[str], timing: Timing,
                log: logging.Logger | None, progress_every: int, deadline: float | None) -> list[dict[str, Any]]:
    """The rows of :func:`time_in_worker` for shapes that are run, one worker after another until all are (or a
    worker stops at the ``deadline``: it exits normally with shapes left)."""
    rows: list[dict[str, Any]] = []
    while len(rows) < len(shapes):
        todo, grads = shapes[len(rows):], input_grad[len(rows):]
        job = json.dumps({"layouts": layouts, "timing": dataclasses.asdict(timing),
                          "shapes": [dataclasses.asdict(c) for c in todo], "input_grad": grads,
                          "deadline": deadline}, default=_scalar)
        with subprocess.Popen([sys.executable, "-m", "trainplan.layout.sweep_worker"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) as worker:
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write(job)
            worker.stdin.close()
            before = len(rows)
            for conv, grad, line in zip(todo, grads, worker.stdout):
                rows.append({**conv_row(conv, grad), "error": "", **json.loads(line)})
                if rows[-1]["error"] and log is not None:
                    log.warning("conv %s %s left out: %s", conv.id, conv_row(conv, grad), rows[-1]["error"])
                if log is not None and progress_every and len(rows) % progress_every == 0:
                    log.info("timed %d of %d shapes", len(rows), len(shapes))
            code = worker.wait()
        if code > 0 and len(rows) == before:  # an error, not a crash on a shape: it would fail on every one
            raise RuntimeError(f"the conv timing worker failed (exit code {code}) before timing any shape "
                               f"(its error is printed above)")
        if code == 0 and len(rows) < len(shapes):  # it stopped at the deadline
            break
        if len(rows) < len(shapes):
            conv, grad = shapes[len(rows)], input_grad[len(rows)]
            rows.append({**conv_row(conv, grad), "error": f"the timing process died (exit code {code})"})
            if log is not None:
                log.warning("conv %s %s crashed the timing process (exit code %s); left out", conv.id,
                            conv_row(conv, grad), code)
    return rows


def _scalar(value: Any) -> Any:
    """JSON form of a numpy scalar in a shape."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to the conv timing worker")


KNOWN_CRASH_MAX_CHANNELS = 16  # 3, 4, 8 and 12 input channels crashed; 16 and 64 did not
KNOWN_CRASH_MIN_PIXELS = 48 * 48  # crashed at 64 and 128 px; 16, 32 and 48 px ran (sweep shapes of 6 and 10 px too)


def known_crash(conv: ConvInfo, layout: str, device: str) -> str:
    """Why PyTorch is known to crash on ``conv`` in ``layout`` on ``device`` ('' if it is not): 2.13's CPU backward
    of a channels_last 1x1 conv with a stride above 1 and few input channels corrupts the heap (seen with 3-12
    channels at 64 px and more), and whether the process dies at once depends on what ran before in it, so a
    probe alone does not find it every time."""
    if (layout == "nhwc" and torch.device(device).type == "cpu" and tuple(conv.weight_shape[2:]) == (1, 1)
            and max(conv.stride) > 1 and conv.in_shape[1] // conv.groups < KNOWN_CRASH_MAX_CHANNELS
            and conv.in_shape[2] * conv.in_shape[3] >= KNOWN_CRASH_MIN_PIXELS):
        return (f"known PyTorch crash: CPU backward of a channels_last 1x1 stride-{max(conv.stride)} conv with "
                f"{conv.in_shape[1] // conv.groups} (< {KNOWN_CRASH_MAX_CHANNELS}) input channels")
    return ""


def unsafe_layouts(convs: dict[str, ConvInfo], input_grad: dict[str, bool], layouts: list[str], timing: Timing,
                   log: logging.Logger | None = None) -> dict[tuple[str, str], str]:
    """(conv, layout) pairs PyTorch is known to crash on (never run), or refuses or crashes on when each conv runs
    once per layout in a worker process (:func:`time_in_worker`), so that the caller does not run them in its own
    process."""
    probe = dataclasses.replace(timing, repeats=1, warmup=0, calls=1)
    ids = list(convs)
    found = {}
    for lay in layouts:
        rows = time_in_worker([convs[c] for c in ids], [input_grad[c] for c in ids], [lay], probe, log)
        found.update({(row["conv"], lay): row["error"] for row in rows if row["error"]})
    return found


def transform_time(shape: tuple[int, ...], src: str, dst: str, timing: Timing, dtype: torch.dtype = torch.float32) -> float:
    """Time to convert an activation of ``shape`` from ``src`` to ``dst`` layout plus its gradient back, on
    ``timing.device``."""
    a, b = memory_format(src), memory_format(dst)
    x = torch.randn(shape, dtype=dtype, device=timing.device).contiguous(memory_format=a)
    g = torch.randn(shape, dtype=dtype, device=timing.device).contiguous(memory_format=b)
    return median_time(lambda: x.contiguous(memory_format=b), timing) + median_time(
        lambda: g.contiguous(memory_format=a), timing)


def _replayable(func: Any) -> Any:
    """Out-of-place, layout-agnostic version of a recorded op: views become reshapes, in-place ops copies."""
    name = func._schema.name.split("::")[-1]
    if name in ("view", "_unsafe_view"):
        return torch.ops.aten.reshape.default
    if name.endswith("_") and not name.startswith("_"):
        packet = getattr(torch.ops.aten, name[:-1], None)
        if packet is not None and func._overloadname in packet.overloads():
            return getattr(packet, func._overloadname)
    return func


def group_forward(graph: ConvGraph, group: str, layout: str, device: str = "cpu") -> Callable[[], list[torch.Tensor]]:
    """A function running ``group``'s recorded ops on ``device`` from leaves in ``layout`` (the conv output and
    any operand from another group); it returns the group's outputs that no later op of the group consumes."""
    fmt, dev = memory_format(layout), torch.device(device)
    ops = [op for op in graph.ops if op.group == group]
    produced: set[int] = set()  # keys made by the group's ops so far (an in-place op re-makes its input's key)
    leaves: dict[int, torch.Tensor] = {}
    for op in ops:
        for key, value in op.inputs.items():
            if key not in leaves and key not in produced:
                leaf = value.to(dev, memory_format=fmt) if value.dim() == 4 else value.to(dev)
                leaves[key] = leaf.requires_grad_(leaf.is_floating_point())
        produced.update(op.outputs)
    funcs = [_replayable(op.func) for op in ops]
    recorded = [tree_map(lambda a: a.to(dev) if isinstance(a, torch.Tensor) else a, (op.args, op.kwargs)) for op in ops]

    def forward() -> list[torch.Tensor]:
        env = dict(leaves)
        results: dict[int, torch.Tensor] = {}
        used: set[int] = set()
        for op, func, (op_args, op_kwargs) in zip(ops, funcs, recorded):
            args, kwargs = tree_map(lambda a: env[a.key] if isinstance(a, Ref) else a, (op_args, op_kwargs))
            used.update(id(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor))
            out = func(*args, **kwargs)
            outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
            results.update((id(o), o) for o in outs if o.requires_grad)
            for key, o in zip(op.outputs, [o for o in outs if o.dim() == 4]):
                env[key] = o
        return [o for k, o in results.items() if k not in used]

    return forward


def input_grads(graph: ConvGraph) -> dict[str, bool]:
    """Whether each conv's backward computes its input's gradient (not for a conv reading the model's input)."""
    first = {dst for (src, dst) in graph.edges if src == INPUT}
    return {cid: cid not in first for cid in graph.convs}


def measure_graph(graph: ConvGraph, layouts: list[str], timing: Timing,
                  log: logging.Logger | None = None) -> dict[str, pd.DataFrame]:
    """Every conv, group and edge of ``graph`` timed in every layout; three tables (convs, groups, edges). A conv
    that PyTorch refuses or crashes on in a layout (:func:`unsafe_layouts`, run first in a worker process) gets no
    times there (NaN) and says why in ``error``; the problem then leaves that layout out of the conv's choices.
    Keeps freed host memory for the rest of the process (``keep_freed_memory``), as the profile does; garbage is
    collected once per conv, group and edge (``gc_paused`` around all its timings), the objects alive at the start
    left out of those collections (``live_objects_frozen``)."""
    keep_freed_memory()
    torch.set_num_threads(timing.threads)
    conv_rows, group_rows, edge_rows = [], [], []
    grads = input_grads(graph)
    unsafe = unsafe_layouts(graph.convs, grads, layouts, timing, log)
    with live_objects_frozen():  # the model's and torch's objects out of each collection
        for cid, conv in graph.convs.items():
            row = conv_row(conv, input_grad=grads[cid])
            row["error"] = "; ".join(f"{lay}: {unsafe[cid, lay]}" for lay in layouts if (cid, lay) in unsafe)
            with gc_paused():
                for lay in layouts:
                    row[f"fwd_{lay}"], row[f"bwd_{lay}"] = ((math.nan, math.nan) if (cid, lay) in unsafe else
                                                            conv_time(conv, lay, timing, input_grad=grads[cid]))
            row["load"] = load_average()
            conv_rows.append(row)
        for group in graph.groups:
            names = [op.name for op in graph.ops if op.group == group]
            row = {"group": group, "n_ops": len(names), "ops": ";".join(sorted(set(names))), "error": ""}
            with gc_paused():
                for lay in layouts:
                    try:
                        fwd, bwd = (_fwd_bwd(group_forward(graph, group, lay, timing.device), timing) if names
                                    else (0.0, 0.0))
                    except (RuntimeError, TypeError, ValueError) as exc:
                        fwd = bwd = float("nan")
                        row["error"] = f"{lay}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    row[f"fwd_{lay}"], row[f"bwd_{lay}"] = fwd, bwd
            group_rows.append(row)
        for (src, dst), shapes in graph.edges.items():
            row = {"src": src, "dst": dst, "shapes": [list(s) for s in shapes]}
            with gc_paused():
                for a in layouts:
                    for b in layouts:
                        if a != b:
                            row[f"{a}->{b}"] = sum(transform_time(s, a, b, timing) for s in shapes)
            edge_rows.append(row)
    return {"convs": pd.DataFrame(conv_rows), "groups": pd.DataFrame(group_rows), "edges": pd.DataFrame(edge_rows)}
