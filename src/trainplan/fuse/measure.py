"""Compile each forward group as one inference kernel with Inductor and measure it against its unfused ops.

The groups are the ``fuse`` rule's, of the model's forward graph (``trace_forward``), run without autograd (the
training step with fused ops, forward and backward, is ``trainplan.fuse.train_step``'s). Per group: the members
become an fx submodule (``fuse_as_graphmodule``) fed the values they read in a real run of the forward pass;
unfused = the submodule run eagerly op by op, fused = Inductor's code for it. Whole forward: the forward graph
with every measured group replaced by its compiled submodule (``fuse_by_partitions``), against the unfused
forward and against Inductor on the whole forward. Compile time is the first call's time, reported apart from
the medians.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import torch
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule, fuse_by_partitions

from trainplan.clock import median_seconds
from trainplan.fuse.errors import FuseError
from trainplan.fuse.forward import trace_forward
from trainplan.fuse.inductor import CallArgs, CompiledOp, count_launches, error_line, fusible_members, tensors_of
from trainplan.models import BuiltModel, on_device
from trainplan.profile.op_times import timed_run
from trainplan.timing import keep_freed_memory, live_objects_frozen


def _copies(args: Sequence[Any]) -> list[Any]:
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def compare_outputs(got: Any, want: Any, rtol: float, atol: float, *, strict: bool = True) -> dict[str, Any]:
    """Largest absolute difference between matching tensors, largest ``|x - y| / (atol + rtol |y|)`` (at most 1
    where ``allclose`` holds), and whether all are within rtol/atol; with ``strict`` a mismatch raises
    FuseError naming the output."""
    worst_abs = worst_ratio = 0.0
    a, b = tensors_of(got), tensors_of(want)
    if len(a) != len(b):
        raise FuseError(f"fused forward returned {len(a)} tensors, the unfused forward {len(b)}")
    matches = True
    for k, (x, y) in enumerate(zip(a, b)):
        if x.is_floating_point():
            gap = (x.double() - y.double()).abs()
            diff = float(gap.max()) if x.numel() else 0.0
            ratio = float((gap / (atol + rtol * y.double().abs())).max()) if x.numel() else 0.0
            worst_abs, worst_ratio = max(worst_abs, diff), max(worst_ratio, ratio)
            ok = torch.allclose(x, y, rtol=rtol, atol=atol)
        else:
            ok = torch.equal(x, y)
        if not ok and strict:
            raise FuseError(f"fused forward output {k} differs from the unfused forward (max abs diff {worst_abs:.3g}; "
                            f"rtol {rtol}, atol {atol})")
        matches &= ok
    return {"max_abs_diff": worst_abs, "max_tolerance_ratio": worst_ratio, "within_tolerance": matches}


def _compile(gm: torch.fx.GraphModule, args: Sequence[Any]) -> tuple[Callable[..., Any], float, int]:
    """Inductor (``torch._inductor.compile``: torch.compile's backend, without Dynamo: the graph is already
    aten ops) of ``gm``; seconds to compile and run once, and kernel launches in the generated code."""
    from torch._inductor.utils import run_and_get_code

    def build() -> Callable[..., Any]:
        fn = torch._inductor.compile(gm, list(args))
        fn(*args)
        return fn

    start = time.perf_counter()
    compiled, code = run_and_get_code(build)
    return compiled, time.perf_counter() - start, count_launches(code)


def select_groups(groups: pd.DataFrame, min_ops: int, max_groups: int) -> pd.DataFrame:
    """Groups of at least ``min_ops`` ops with at least one kernel, largest measured time first, capped."""
    keep = groups[(groups["n_ops"] >= min_ops) & (groups["kernels"] >= 1)]
    return keep.sort_values(["time_s", "group"], ascending=[False, True]).head(max_groups)


def measure_fusion(built: BuiltModel, groups_doc: dict[str, Any], groups: pd.DataFrame, *,
                   min_ops: int, max_groups: int, repeats: int, warmup: int, whole_step: bool,
                   rtol: float, atol: float, log: Callable[[str], None] = lambda _m: None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per-group fused vs unfused times and the whole-forward comparison (see the module docstring). Keeps freed
    host memory for the rest of the process (``keep_freed_memory``), as the profile does. A group naming an op
    the forward graph lacks raises FuseError naming both (groups of another model, torch version or graph)."""
    allocator = keep_freed_memory()
    fg = trace_forward(on_device(built, "cpu"))
    gm = fg.gm
    inputs = [t.detach() for t in fg.inputs]
    by_name = {n.name: n for n in gm.graph.nodes}
    members = {g["id"]: g["nodes"] for g in groups_doc["groups"]}
    for gid, names in members.items():
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise FuseError(f"model '{built.name}': group {gid} names op '{unknown[0]}' that its forward graph lacks; "
                            "re-run the fuse rule for this model and torch version")
    chosen = select_groups(groups, min_ops, max_groups)
    rows, failed = [], []
    with torch.no_grad(), live_objects_frozen():  # the model's and torch's objects out of each collection
        _, env = timed_run(gm, inputs, lambda: None, keep_values=True)
        for row in chosen.itertuples(index=False):
            nodes = fusible_members([by_name[name] for name in members[row.group]])
            sub, sub_inputs, _ = fuse_as_graphmodule(gm, nodes, f"group_{row.group}")
            args = [env[n] for n in sub_inputs]
            unfused = median_seconds(lambda: sub(*args), time.perf_counter, repeats, warmup)
            try:
                compiled, compile_s, launches = _compile(sub, args)
            except Exception as exc:  # Inductor cannot compile this submodule: reported, left unfused
                failed.append({"group": int(row.group), "n_ops": int(row.n_ops), "error": error_line(exc)})
                log(f"group {row.group} ({row.n_ops} ops): Inductor failed, left unfused: {failed[-1]['error']}")
                continue
            fused = median_seconds(lambda: compiled(*args), time.perf_counter, repeats, warmup)
            # an in-place member (a residual add_) mutates its argument on every call: check on fresh copies
            compare_outputs(compiled(*_copies(args)), sub(*_copies(args)), rtol, atol)
            rows.append({"group": row.group, "n_ops": row.n_ops, "phase": row.phase, "module": row.module,
                         "profiled_s": row.time_s, "unfused_s": unfused, "fused_s": fused, "speedup": unfused / fused,
                         "kernels_unfused": row.kernels, "kernels_fused": launches,
                         "launches_saved": row.kernels - launches, "internal_bytes": row.internal_bytes,
                         "compile_s": compile_s})
            log(f"group {row.group} ({row.n_ops} ops): unfused {unfused * 1e3:.3f} ms, fused {fused * 1e3:.3f} ms, "
                f"compile {compile_s:.1f} s")
        del env
        compiled_groups = [g for g in chosen["group"] if g not in {f["group"] for f in failed}]
        summary = _whole_forward(gm, inputs, [[n.name for n in fusible_members([by_name[m] for m in members[g]])]
                                              for g in compiled_groups], repeats, warmup, whole_step, rtol, atol, log)
    table = pd.DataFrame(rows, columns=["group", "n_ops", "phase", "module", "profiled_s", "unfused_s", "fused_s",
                                        "speedup", "kernels_unfused", "kernels_fused", "launches_saved",
                                        "internal_bytes", "compile_s"])
    summary.update({
        "model": built.name, "graph": "forward (inference: no autograd)",
        "groups_eligible": int(((groups["n_ops"] >= min_ops) & (groups["kernels"] >= 1)).sum()),
        "groups_measured": len(rows), "groups_failed": failed, "cap": {"max_groups": max_groups, "min_ops": min_ops,
                                             "order": "largest measured (profiled) time first"},
        "repeats": repeats, "warmup": warmup, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "host_allocator": allocator,
        "launches_saved": int(table["launches_saved"].sum()) if len(table) else 0,
        "internal_bytes": int(table["internal_bytes"].sum()) if len(table) else 0,
        "group_compile_s": float(table["compile_s"].sum()) if len(table) else 0.0,
    })
    return table, summary


def _whole_forward(gm: torch.fx.GraphModule, inputs: list[torch.Tensor], chosen: list[list[str]],
                   repeats: int, warmup: int, whole_step: bool,
                   rtol: float, atol: float, log: Callable[[str], None]) -> dict[str, Any]:
    want = gm(*inputs)
    out: dict[str, Any] = {"unfused_forward_s": median_seconds(lambda: gm(*inputs), time.perf_counter, repeats, warmup)}
    copied = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    names = {n.name: n for n in copied.graph.nodes}
    fused_gm = fuse_by_partitions(copied, [{names[m]: None for m in g} for g in chosen], prefix="fused_")
    recorder = CallArgs(fused_gm)
    recorder.run(*inputs)  # each fused op's real inputs
    start = time.perf_counter()
    for name, args in recorder.args.items():
        setattr(fused_gm, name, CompiledOp(torch._inductor.compile(getattr(fused_gm, name), list(args))))
    del recorder
    got = fused_gm(*inputs)
    out["fused_forward_compile_s"] = time.perf_counter() - start
    out["fused_forward_check"] = compare_outputs(got, want, rtol, atol)
    out["fused_forward_s"] = median_seconds(lambda: fused_gm(*inputs), time.perf_counter, repeats, warmup)
    out["fused_speedup"] = out["unfused_forward_s"] / out["fused_forward_s"]
    log(f"forward: unfused {out['unfused_forward_s']:.4f} s, groups fused {out['fused_forward_s']:.4f} s")
    if whole_step:
        start = time.perf_counter()
        try:
            whole = torch._inductor.compile(gm, inputs)
            got = whole(*inputs)
        except Exception as exc:  # a forward Inductor cannot compile is reported, not fatal
            out["whole_compile_error"] = error_line(exc)
            log(f"Inductor on the whole forward failed: {out['whole_compile_error']}")
            return out
        out["whole_compile_s"] = time.perf_counter() - start
        # the reference compiler's own numerics: reported, not enforced (Inductor reorders reductions)
        out["whole_check"] = compare_outputs(got, want, rtol, atol, strict=False)
        out["whole_forward_s"] = median_seconds(lambda: whole(*inputs), time.perf_counter, repeats, warmup)
        out["whole_speedup"] = out["unfused_forward_s"] / out["whole_forward_s"]
        out["kept_of_whole_gain"] = ((out["unfused_forward_s"] - out["fused_forward_s"])
                                     / (out["unfused_forward_s"] - out["whole_forward_s"])
                                     if out["whole_forward_s"] < out["unfused_forward_s"] else None)
        log(f"forward: Inductor on the whole {out['whole_forward_s']:.4f} s (compile {out['whole_compile_s']:.1f} s)")
    return out
