"""The training step with fused ops: the forward graph partitioned by the seed's rule, every group of >=
``min_ops`` ops compiled by Inductor with autograd (AOT autograd derives the fused op's backward and decides
what it saves), timed in alternating rounds against the eager step, next to the step with only the groups
measured faster and to Inductor on the whole forward. Loss and gradients are checked twice: the same groups
fused in a float64 copy of the model must match its eager float64 step (a wrong kernel fails the rule); the
float32 steps' distance from the exact step is reported per parameter against eager's own (batch norms over a
few values make float32 far from exact on deep CNNs, and a fused reduction lands elsewhere in that noise).

Per group (at most ``max_groups``, largest first): the fused op's forward + backward against its ops run
eagerly, on the inputs the group gets in a real step, also in alternating rounds; kernels dispatched by the
eager ops (forward and backward, views not counted) against launches in Inductor's generated code.
"""
from __future__ import annotations

import copy
import math
import operator
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions
from torch.utils._python_dispatch import TorchDispatchMode

from trainplan.fuse.baselines import fx_capability_groups, ort_wave_groups
from trainplan.fuse.coverage import coverage
from trainplan.fuse.forward import ForwardGraph, forward_groups, trace_forward
from trainplan.fuse.inductor import CallArgs, CompiledOp, count_launches, error_line, fusible_members, tensors_of
from trainplan.fuse.support import SupportTable
from trainplan.models import BuiltModel
from trainplan.stats import paired_speedup_ci
from trainplan.timing import gc_paused, keep_freed_memory

#: the fused step's float32 gradients may be this many times further from the exact (float64) gradients than
#: the eager float32 step's (relative to each parameter's largest exact entry): fused kernels sum in another order
EAGER_ERROR_FACTOR = 3.0


def _loss(value: Any) -> torch.Tensor:
    """The forward's result: Inductor returns a graph's single output in a list."""
    return value[0] if isinstance(value, (list, tuple)) else value


def _flatten_output(sub: torch.fx.GraphModule) -> None:
    """A group whose output op returns several tensors (``split``) returns them as a flat tuple: AOT autograd
    rejects a nested output. The parent's ``getitem`` of the fused op's result reads the same element."""
    out = next(n for n in sub.graph.nodes if n.op == "output")
    result = out.args[0]
    if isinstance(result, torch.fx.Node) and isinstance(result.meta.get("val"), (list, tuple)):
        with sub.graph.inserting_before(out):
            items = tuple(sub.graph.call_function(operator.getitem, (result, i)) for i in range(len(result.meta["val"])))
        out.args = (items,)
        sub.recompile()


def _leaves(args: Sequence[Any]) -> list[Any]:
    """The recorded arguments as leaves (no history of the step they came from), requiring grad as they did."""
    return [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]


def _forward_backward(fn: Callable[..., Any], args: Sequence[Any]) -> None:
    outs = [t for t in tensors_of(fn(*args)) if t.requires_grad]
    torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])


def _compile(sub: torch.fx.GraphModule, args: Sequence[Any]) -> tuple[Callable[..., Any], float, int]:
    """Inductor with autograd of ``sub`` (its example inputs require grad where the step's do); seconds to
    compile and run forward + backward once, and kernel launches in the forward and backward code."""
    from torch._inductor.utils import run_and_get_code

    def build() -> Callable[..., Any]:
        fn = torch._inductor.compile(sub, list(args))
        _forward_backward(fn, _leaves(args))
        return fn

    start = time.perf_counter()
    compiled, code = run_and_get_code(build)
    return compiled, time.perf_counter() - start, count_launches(code)


class _Dispatched(TorchDispatchMode):
    """Counts the aten ops dispatched (views and aliases left out): the kernels eager mode runs."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def _eager_kernels(sub: torch.fx.GraphModule, args: Sequence[Any]) -> int:
    with _Dispatched() as counter:
        _forward_backward(sub, _leaves(args))
    return counter.count


def alternate(fns: dict[str, Callable[[], Any]], rounds: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per call of each function, in ``rounds`` rounds that run every function once in turn (a change
    of load hits all alike; paired by round), after ``warmup`` such rounds; GC paused, CUDA synchronised."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else (lambda: None)
    with gc_paused():
        for r in range(warmup + rounds):
            for name, fn in fns.items():
                sync()
                start = time.perf_counter()
                fn()
                sync()
                elapsed = time.perf_counter() - start
                if r >= warmup:
                    samples[name].append(elapsed)
    return samples


def speedup_vs(samples: dict[str, list[float]], base: str, new: str, seed: int) -> dict[str, Any]:
    """Median ``base`` / median ``new`` seconds, its paired bootstrap 95% interval, and whether it lies
    above 1 (``faster``) or below (``slower``)."""
    low, high = paired_speedup_ci(samples[base], samples[new], seed)
    return {"speedup": statistics.median(samples[base]) / statistics.median(samples[new]), "ci95": [low, high],
            "faster": low > 1.0, "slower": high < 1.0}


def partition_forward(fg: ForwardGraph, table: SupportTable) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Groups of the forward graph (``forward_groups``: GROUPS.json entries, topological order, checked
    independently) and their statistics, with ONNX Runtime's waves and torch.fx's CapabilityBasedPartitioner on
    the same mask (the cost of the seed's rule)."""
    graph, fusion, groups = forward_groups(fg, table)
    doc = fusion.to_dict(graph)
    eligible = {graph.names[u] for u in range(graph.n) if fusion.eligible[u]}
    baselines = {}
    methods = {"onnxruntime waves": ort_wave_groups, "torch.fx CapabilityBasedPartitioner": fx_capability_groups}
    for method, group_fn in methods.items():
        start = time.perf_counter()
        found = group_fn(graph, fusion.eligible)
        elapsed = time.perf_counter() - start
        cover = coverage(found, fusion.eligible, np.zeros(graph.n))
        baselines[method] = {"groups_ge2": cover["groups_ge2"], "largest": cover["largest"],
                             "coverage_ops": cover["coverage_ops"], "time_s": elapsed}
    sizes = [len(g["nodes"]) for g in doc["groups"]]
    big = [s for s in sizes if s >= 2]
    stats = {"ops": graph.n - 1, "eligible": len(eligible), "host_ops": len(doc["host_nodes"]) - 1,
             "groups": len(sizes), "groups_ge2": len(big), "largest": max(sizes, default=0),
             "coverage_ops": sum(big) / len(eligible) if eligible else 0.0,
             "partition_s": fusion.stats["time_s"], "baselines": baselines}
    return doc["groups"], stats


def _intermediate_bytes(fg: ForwardGraph, group: dict[str, Any]) -> int:
    """Bytes the group's ops write in the eager forward that its result does not hold (views and ``getitem``
    write nothing): what a fused forward kernel need not write, unless its backward saves it."""
    by_name = {n.name: n for n in fg.gm.graph.nodes}
    total = 0
    for name in group["nodes"]:
        node = by_name[name]
        if name == group["output"] or node.target is operator.getitem or getattr(node.target, "is_view", False):
            continue
        total += sum(t.numel() * t.element_size() for t in tensors_of(node.meta.get("val")))
    return total


def _fuse(fg: ForwardGraph, groups: list[list[str]]) -> torch.fx.GraphModule:
    """A copy of the forward graph with each group (names) an fx submodule ``fused_<k>``."""
    copied = torch.fx.GraphModule(fg.gm, copy.deepcopy(fg.gm.graph))
    by_name = {n.name: n for n in copied.graph.nodes}
    parts = [{n: None for n in fusible_members([by_name[m] for m in g])} for g in groups]
    return fuse_by_partitions(copied, parts, prefix="fused_")


def _step(fn: Callable[..., Any], fg: ForwardGraph) -> torch.Tensor:
    for p in fg.params:
        p.grad = None
    loss = _loss(fn(*fg.inputs))
    loss.backward()
    return loss.detach()


def check_against_exact(built: BuiltModel, fg: ForwardGraph, steps: dict[str, Callable[..., Any]], rtol: float,
                        atol: float) -> dict[str, dict[str, Any]]:
    """Loss and gradients of each step function (``fn(*fg.inputs)``, ``eager`` among them) against the model's
    step in float64, per parameter (and the loss): largest absolute error <= floor + allowance x the exact
    gradient's largest entry. floor = ``atol`` x the largest exact gradient entry of the model (a gradient that is
    zero in exact arithmetic, such as a bias before a batch norm, is float32 noise alone); allowance = max(rtol,
    EAGER_ERROR_FACTOR x the eager float32 step's own relative error there), so a parameter that eager gets right
    is checked tightly. ``worst_ratio``: the largest error over what it may be (<= 1 passes)."""
    exact_model = copy.deepcopy(built.module).double()
    batch = {k: v.double() if v.is_floating_point() else v for k, v in built.batch.items()}
    loss64 = built.loss_fn(exact_model(**batch))
    loss64.backward()
    exact_loss = loss64.item()
    exact = [p.grad if p.grad is not None else torch.zeros_like(p) for p in exact_model.parameters()]
    if len(exact) != len(fg.params):
        raise AssertionError(f"model '{fg.model}': {len(exact)} parameters, the forward graph takes {len(fg.params)}")
    scales = [abs(exact_loss), *(float(e.abs().max()) for e in exact)]
    floors = [atol * scales[0]] + [atol * max(scales[1:], default=0.0)] * len(exact)
    errors: dict[str, list[float]] = {}
    losses: dict[str, float] = {}
    for name, fn in steps.items():
        losses[name] = float(_step(fn, fg))
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in fg.params]
        gaps = (float((g.double() - e).abs().max()) for g, e in zip(grads, exact))
        errors[name] = [abs(losses[name] - exact_loss), *gaps]
    allowed = [max(rtol, EAGER_ERROR_FACTOR * err / scale if scale > 0 else math.inf)
               for err, scale in zip(errors["eager"], scales)]
    where = ["loss", *fg.param_names]
    results: dict[str, dict[str, Any]] = {}
    for name, errs in errors.items():
        ratios = [err / (floor + (a * scale if scale > 0 else 0.0)) if err > 0 else 0.0
                  for err, floor, a, scale in zip(errs, floors, allowed, scales)]
        worst = max(range(len(ratios)), key=ratios.__getitem__)
        results[name] = {"loss": losses[name], "exact_loss": exact_loss, "worst_ratio": ratios[worst],
                         "worst_at": where[worst], "its_error": errs[worst], "its_exact_scale": scales[worst],
                         "its_allowance": allowed[worst], "floor": floors[worst],
                         "within_tolerance": ratios[worst] <= 1.0}
    return results


def _compile_groups(fg: ForwardGraph, groups: list[dict[str, Any]], log: Callable[[str], None]
                    ) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """Compile every group on the inputs it gets in a real step: per group id the compiled op, its seconds and
    launches, the eager submodule and its inputs; and the groups Inductor failed on (left unfused)."""
    fused = _fuse(fg, [g["nodes"] for g in groups])
    recorder = CallArgs(fused)
    recorder.run(*fg.inputs)
    compiled, failed = {}, []
    for k, group in enumerate(groups):
        sub, args = getattr(fused, f"fused_{k}"), recorder.args[f"fused_{k}"]
        _flatten_output(sub)
        try:
            fn, seconds, launches = _compile(sub, args)
        except Exception as exc:  # Inductor cannot compile this group: reported, left unfused in the step
            failed.append({"group": group["id"], "n_ops": len(group["nodes"]), "error": error_line(exc)})
            log(f"group {group['id']}: Inductor failed, left unfused: {failed[-1]['error']}")
            continue
        compiled[group["id"]] = {"fn": fn, "compile_s": seconds, "launches": launches, "sub": sub, "args": args}
    return compiled, failed


def _time_groups(fg: ForwardGraph, groups: list[dict[str, Any]], compiled: dict[int, dict[str, Any]], rounds: int,
                 warmup: int, seed: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """One row per compiled group: its forward + backward, eager ops against the fused op, in alternating
    rounds; kernels dispatched eagerly against launches in the generated code."""
    rows = []
    for group in groups:
        if group["id"] not in compiled:
            continue
        c = compiled[group["id"]]
        leaves = _leaves(c["args"])
        times = alternate({"eager": lambda: _forward_backward(c["sub"], leaves),
                           "fused": lambda: _forward_backward(c["fn"], leaves)}, rounds, warmup)
        verdict = speedup_vs(times, "eager", "fused", seed)
        kernels = _eager_kernels(c["sub"], c["args"])
        rows.append({"group": group["id"], "n_ops": len(group["nodes"]), "input": group["input"],
                     "output": group["output"], "ops": " ".join(group["ops"]), "eager_s": statistics.median(times["eager"]),
                     "fused_s": statistics.median(times["fused"]), "speedup": verdict["speedup"],
                     "ci95_low": verdict["ci95"][0], "ci95_high": verdict["ci95"][1], "faster": verdict["faster"],
                     "kernels_eager": kernels, "kernels_fused": c["launches"], "launches_saved": kernels - c["launches"],
                     "intermediate_bytes": _intermediate_bytes(fg, group), "compile_s": c["compile_s"]})
        log(f"group {group['id']} ({len(group['nodes'])} ops): forward + backward {verdict['speedup']:.3f}x "
            f"(95% CI {verdict['ci95'][0]:.3f}-{verdict['ci95'][1]:.3f}); kernels {kernels} -> {c['launches']}; "
            f"compile {c['compile_s']:.1f} s")
    return rows


def check_float64(built: BuiltModel, fg32: ForwardGraph, groups: list[dict[str, Any]], rtol: float, atol: float,
                  log: Callable[[str], None]) -> dict[str, Any]:
    """The same groups (node sets of ``fg32``) fused in a float64 copy of the model against its eager float64
    step. A group is checked where the float64 trace has its ops with the same names and inputs (a model that
    casts to float32, as GPT-2's loss does with ``.float()``, traces one more op there; such groups are
    counted in ``groups_not_in_float64_trace``). Reordered sums
    change the gradients by ~1e-12 there, so a wrong fused kernel shows. Per parameter (and the loss): largest
    absolute difference <= atol x the model's largest gradient entry + rtol x the eager gradient's largest."""
    module = copy.deepcopy(built.module).double()
    batch = {k: v.double() if v.is_floating_point() else v for k, v in built.batch.items()}
    fg = trace_forward(BuiltModel(built.name, module, batch, built.loss_fn))
    def signature(gm: torch.fx.GraphModule) -> dict[str, tuple[Any, ...]]:
        return {n.name: (n.target, *(a.name for a in n.all_input_nodes)) for n in gm.graph.nodes if n.op == "call_function"}

    ops, ops32 = signature(fg.gm), signature(fg32.gm)
    same = [g for g in groups if all(ops.get(m) == ops32[m] for m in g["nodes"])]
    compiled, failed = _compile_groups(fg, same, log)
    fused = _with_compiled(fg, [g for g in same if g["id"] in compiled], {k: c["fn"] for k, c in compiled.items()})
    results = []
    for fn in (fg.gm, fused):
        loss = float(_step(fn, fg))
        results.append([loss, *(p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in fg.params)])
    (loss_e, *eager), (loss_f, *got) = results
    floor = atol * max(float(g.abs().max()) for g in eager)
    ratios = [abs(loss_f - loss_e) / (atol * abs(loss_e) + rtol * abs(loss_e))] + [
        float((g - e).abs().max()) / (floor + rtol * float(e.abs().max())) for g, e in zip(got, eager)]
    worst = max(range(len(ratios)), key=ratios.__getitem__)
    return {"groups": len(compiled), "groups_not_in_float64_trace": len(groups) - len(same), "failed": failed,
            "worst_ratio": ratios[worst], "worst_at": ["loss", *fg.param_names][worst],
            "within_tolerance": ratios[worst] <= 1.0 and len(compiled) == len(same)}


def _with_compiled(fg: ForwardGraph, groups: list[dict[str, Any]], compiled: dict[int, Callable[..., Any]]
                   ) -> torch.fx.GraphModule:
    """The forward graph with each of ``groups`` run by its compiled op."""
    fused = _fuse(fg, [g["nodes"] for g in groups])
    for k, group in enumerate(groups):
        setattr(fused, f"fused_{k}", CompiledOp(compiled[group["id"]]))
    return fused


def measure_train_step(built: BuiltModel, table: SupportTable, *, min_ops: int, max_groups: int, rounds: int,
                       warmup: int, whole_step: bool, rtol: float, atol: float, seed: int,
                       log: Callable[[str], None] = lambda _m: None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Partition the forward graph, compile and time its groups, then time and check three steps against eager
    (module docstring): ``fused`` (every compiled group), ``selected`` (the groups whose own forward + backward
    measured faster beyond noise: chosen on the per-group rounds, timed on the step's own) and ``whole``."""
    allocator = keep_freed_memory()
    fg = trace_forward(built)
    groups, graph_stats = partition_forward(fg, table)
    eligible = sorted((g for g in groups if len(g["nodes"]) >= min_ops), key=lambda g: (-len(g["nodes"]), g["id"]))
    chosen = sorted(eligible[:max_groups], key=lambda g: g["id"])
    log(f"forward graph: {graph_stats['ops']} ops, {graph_stats['groups_ge2']} groups of >= 2 ops "
        f"(largest {graph_stats['largest']}), {graph_stats['host_ops']} on the host; compiling {len(chosen)}")
    compiled, failed = _compile_groups(fg, chosen, log)
    rows = _time_groups(fg, chosen, compiled, rounds, warmup, seed, log)
    faster = {r["group"] for r in rows if r["faster"]}
    fns = {k: c["fn"] for k, c in compiled.items()}
    steps: dict[str, Callable[..., Any]] = {
        "eager": fg.gm,
        "fused": _with_compiled(fg, [g for g in chosen if g["id"] in compiled], fns),
        "selected": _with_compiled(fg, [g for g in chosen if g["id"] in faster], fns),
    }
    summary: dict[str, Any] = {
        "model": built.name, "graph": "forward (autograd derives each fused op's backward)",
        "forward_graph": graph_stats, "groups_eligible": len(eligible),
        "cap": {"max_groups": max_groups, "min_ops": min_ops, "order": "most ops first"},
        "groups_compiled": len(compiled), "groups_selected": sorted(faster), "groups_failed": failed,
        "groups_compile_s": sum(c["compile_s"] for c in compiled.values()),
    }
    if whole_step:
        start = time.perf_counter()
        try:
            whole = torch._inductor.compile(fg.gm, list(fg.inputs))
            _step(whole, fg)
            steps["whole"] = whole
            summary["whole_compile_s"] = time.perf_counter() - start
        except Exception as exc:  # a forward Inductor cannot compile is reported, not fatal
            summary["whole_compile_error"] = error_line(exc)
            log(f"Inductor on the whole forward failed: {summary['whole_compile_error']}")
    summary["check"] = check_against_exact(built, fg, steps, rtol, atol)
    summary["check_float64"] = check_float64(built, fg, [g for g in chosen if g["id"] in compiled], rtol, atol, log)
    if not summary["check_float64"]["within_tolerance"]:
        raise AssertionError(f"model '{built.name}': the fused step in float64 differs from the eager float64 step: "
                             f"{summary['check_float64']}")
    load = [os.getloadavg()[0]]
    samples = alternate({name: (lambda fn=fn: _step(fn, fg)) for name, fn in steps.items()}, rounds, warmup)
    load.append(os.getloadavg()[0])
    summary.update({f"{name}_step_s": statistics.median(s) for name, s in samples.items()})
    summary["samples_s"] = samples
    for name in samples:
        if name != "eager":
            summary[f"{name}_vs_eager"] = speedup_vs(samples, "eager", name, seed)
    if "whole" in samples:
        gain = summary["eager_step_s"] - summary["whole_step_s"]
        summary["kept_of_whole_gain"] = {name: (summary["eager_step_s"] - summary[f"{name}_step_s"]) / gain
                                         if gain > 0 else None for name in ("fused", "selected")}
    summary.update({"rounds": rounds, "warmup": warmup, "threads": torch.get_num_threads(), "torch": torch.__version__,
                    "host_allocator": allocator, "load_average": {"before": load[0], "after": load[1]}})
    for name in samples:
        if name != "eager":
            v = summary[f"{name}_vs_eager"]
            log(f"step {name}: {summary[f'{name}_step_s']:.4f} s against eager {summary['eager_step_s']:.4f} s: "
                f"{v['speedup']:.3f}x (95% CI {v['ci95'][0]:.3f}-{v['ci95'][1]:.3f})")
    table_df = pd.DataFrame(rows, columns=["group", "n_ops", "input", "output", "ops", "eager_s", "fused_s", "speedup",
                                           "ci95_low", "ci95_high", "faster", "kernels_eager", "kernels_fused",
                                           "launches_saved", "intermediate_bytes", "compile_s"])
    return table_df, summary
