"""Benchmark: how long a cached ``trainplan.plan`` call takes; writes bench/results/plan_cache.md and .csv.

    python bench/bench_plan_cache.py [--models gpt2 llama_100m resnet50] [--calls 3] [--budget 0.5]

Per model (bench_vs_pytorch's, each at one sample: a cached call traces the step and compiles the plan, whose
cost follows the graph's size, not the batch's), a first process plans into a fresh cache (profile and solve),
then ``--calls`` fresh processes each build the model and call ``trainplan.plan`` again with the same arguments.
Reported per call: the call's wall seconds (``plan_s`` of the report: trace, cache read, compile), of them the
trace's (``trace_s``), and the process's wall seconds from start to the planned module (imports and the model's
build included). Run it alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_vs_pytorch import MODELS
from host_load import MATMUL_N, matmul_gflops

OUT = Path(__file__).resolve().parents[1] / "bench" / "results"
PLAN_TIME_LIMIT_S = 10.0  # the solver's limit on the first (uncached) call: the cached calls do not solve
#: one sample per batch: the graph (and so the trace and the compile) is the full model's
ONE_SAMPLE = {"batch_size": 1}

CALL = """
import json, sys, time
start = time.perf_counter()
import torch, trainplan
from trainplan.models import build_model
spec, budget, cache, limit = json.loads(sys.argv[1])
torch.set_num_threads(2)
built = build_model("m", spec, seed=0)
planned = trainplan.plan(built.module, built.batch, budget, loss_fn=built.loss_fn, cache_dir=cache,
                         time_limit_s=limit, on_infeasible="raise_budget", progress=False)
r = planned.report
print("RESULT " + json.dumps({"cache_hit": r.cache_hit, "plan_s": r.plan_s, "trace_s": r.trace_s,
                              "process_s": time.perf_counter() - start, "status": r.status}))
"""


def call(spec: dict[str, Any], budget: str, cache: str) -> dict[str, Any]:
    """One ``trainplan.plan`` call in a fresh process; its RESULT line."""
    out = subprocess.run([sys.executable, "-c", CALL, json.dumps([spec, budget, cache, PLAN_TIME_LIMIT_S])],
                         capture_output=True, text=True)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"plan call failed: {(out.stderr or out.stdout).strip()[-2000:]}")
    return json.loads(line.removeprefix("RESULT "))


def main() -> None:
    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "llama_100m", "resnet50"], choices=sorted(MODELS))
    parser.add_argument("--calls", type=int, default=3, help="cached calls, each in a fresh process")
    parser.add_argument("--budget", default="0.5")
    args = parser.parse_args()
    rows = []
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    gflops = matmul_gflops()
    for model in args.models:
        spec = {**MODELS[model], "inputs": {**MODELS[model]["inputs"], **ONE_SAMPLE}}
        with tempfile.TemporaryDirectory(prefix="trainplan-plan-cache-") as cache:
            first = call(spec, args.budget, cache)
            cached = [call(spec, args.budget, cache) for _ in range(args.calls)]
        if first["cache_hit"] or not all(c["cache_hit"] for c in cached):
            raise RuntimeError(f"{model}: expected a miss, then hits: {first}, {cached}")
        plan_s, trace_s, process_s = ([c[k] for c in cached] for k in ("plan_s", "trace_s", "process_s"))
        rows.append({"model": model, "inputs": json.dumps(spec["inputs"]), "first_plan_s": first["plan_s"],
                     "cached_plan_s": statistics.median(plan_s), "cached_plan_min_s": min(plan_s),
                     "cached_plan_max_s": max(plan_s), "cached_trace_s": statistics.median(trace_s),
                     "cached_process_s": statistics.median(process_s),
                     "status": first["status"]})
        print(json.dumps(rows[-1]), flush=True)
    frame = pd.DataFrame(rows)
    OUT.mkdir(parents=True, exist_ok=True)
    frame.to_csv(OUT / "plan_cache.csv", index=False)
    command = "python bench/bench_plan_cache.py " + " ".join(sys.argv[1:])
    (OUT / "plan_cache.md").write_text(
        f"# A cached trainplan.plan call\n\n`{command}`, started {began}, budget {args.budget}, {args.calls} cached "
        "calls per model, each in a fresh process, 2 threads. `first_plan_s`: the uncached call (trace, profile, "
        f"solve with a {PLAN_TIME_LIMIT_S:g}-s limit, compile); `cached_plan_s`: the cached call (trace, cache read, "
        "compile: `planned.report.plan_s`), median with min-max; `cached_trace_s`: of it, the trace (median); "
        "`cached_process_s`: the cached call's process from start to the planned module (imports and the model's "
        f"build included). Run alone on the machine; its speed at the start: {gflops:.0f} GFLOP/s on a {MATMUL_N} x "
        f"{MATMUL_N} fp32 matmul, 2 threads.\n\n"
        + frame.to_markdown(index=False, floatfmt=".2f") + "\n")


if __name__ == "__main__":
    main()
