"""Benchmark: trainplan against PyTorch's own memory tools on one meter; writes bench/results/vs_pytorch.md,
.csv and .png (the memory/time frontier).

    python bench/bench_vs_pytorch.py [--models gpt2] [--repeats 5] [--processes 1] [--methods ...] [--name STEM]

Every method trains the same model (random weights, seed 0) with AdamW, one full step each time (forward, loss,
backward, ``optimizer.step()``, ``zero_grad()``), in a fresh Python process per method and process repeat:

- ``eager``: the model as it is;
- ``hf_checkpointing``: Hugging Face's ``gradient_checkpointing_enable()`` (models that support it);
- ``compile@B``: ``torch.compile`` with ``torch._functorch.config.activation_memory_budget = B``;
- ``compile+exact@B``: the same, its partitioner's knapsack solved exactly (``trainplan.loop.knapsack``);
- ``trainplan@F``: ``trainplan.plan(model, batch, F)`` (F a fraction of the step's no-recompute peak; where no
  schedule meets it, the least budget found: ``planned_budget_bytes`` says which), gradients to ``.grad``;
- ``trainplan+opt@F``: the same with the optimizer in the plan (``optimizer=``): each update in backward;
- ``sac@F``: the plan of ``trainplan@F`` exported as selective activation checkpointing of each block
  (``trainplan.loop.sac``), the model run eagerly under it;
- ``sac+compile@F``: the same export under ``torch.compile`` (its partitioner honours the policy's MUST_*).

The meter is the process's (``execute.measure.process_peak_during``: resident memory's high-water mark above
what the process held before the step, with freed memory returned to the system), the same for every method:
it counts the parameters' gradients, activations, temporaries, compiled code's buffers, the optimizer's
temporaries and everything else the step allocates; the parameters, the batch and the optimizer's state
(after the warm-up steps) are held before and not counted. Time is the step's wall time, median of
``--repeats`` steps after 2 warm-ups, with its spread (min-max) over all steps of all processes. Setup
(compiling, or tracing, profiling and solving a plan) is reported apart. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results"

#: models (entries of config/config.yaml's format); gpt2 is the default study's shape
MODELS: dict[str, dict[str, Any]] = {
    "gpt2": {"source": "transformers", "architecture": "GPT2LMHeadModel", "config": {},
             "inputs": {"batch_size": 2, "seq_len": 128}},
    "gpt2_4x512": {"source": "transformers", "architecture": "GPT2LMHeadModel", "config": {},
                   "inputs": {"batch_size": 4, "seq_len": 512}},
    "llama_100m": {"source": "transformers", "architecture": "LlamaForCausalLM",
                   "config": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
                              "num_attention_heads": 12, "num_key_value_heads": 12, "vocab_size": 32000},
                   "inputs": {"batch_size": 4, "seq_len": 512}},
    "resnet50": {"source": "transformers", "architecture": "ResNetForImageClassification", "config": {},
                 "inputs": {"batch_size": 16, "image_size": 224}},
}
COMPILE_BUDGETS = (1.0, 0.6, 0.3, 0.05)
PLAN_FRACTIONS = (0.8, 0.5, 0.3, 0.1)
WARMUP = 2
OURS = ("trainplan", "compile+exact", "sac")  # method families that are trainplan's
PLAN_TIME_LIMIT_S = 60.0


def methods(model: str) -> list[str]:
    hf = [] if model.startswith("resnet") else ["hf_checkpointing"]  # transformers' ResNet has no checkpointing
    return (["eager", *hf, *(f"compile@{b}" for b in COMPILE_BUDGETS), *(f"compile+exact@{b}" for b in COMPILE_BUDGETS[1:]),
             *(f"trainplan@{f}" for f in PLAN_FRACTIONS),
             *(f"trainplan+opt@{f}" for f in PLAN_FRACTIONS), *(f"sac@{f}" for f in PLAN_FRACTIONS),
             *(f"sac+compile@{f}" for f in PLAN_FRACTIONS)])


def _prepared(model: str, method: str, cache: Path) -> tuple[Any, dict[str, Any], float]:
    """The callable doing one step, facts about the method, and its setup seconds."""
    import torch

    import trainplan
    from trainplan.loop.knapsack import ExactKnapsack
    from trainplan.loop.sac import sac_policy
    from trainplan.models import build_model

    built = build_model(model, MODELS[model], seed=0)
    module, batch = built.module, built.batch
    if hasattr(module, "config"):
        module.config.use_cache = False
    if hasattr(module, "loss_type"):
        module.loss_type = "ForCausalLM"  # else torch.compile breaks the graph at the loss-type warning
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
    facts: dict[str, Any] = {}
    start = time.perf_counter()
    kind, _, value = method.partition("@")
    if kind == "eager":
        forward = module
    elif kind == "hf_checkpointing":
        module.gradient_checkpointing_enable()
        forward = module
    elif kind in ("compile", "compile+exact"):
        torch._functorch.config.activation_memory_budget = float(value)
        if kind == "compile+exact":
            torch._functorch.config.activation_memory_budget_solver = ExactKnapsack(time_limit_s=PLAN_TIME_LIMIT_S)
        forward = torch.compile(module)
    else:
        planned = trainplan.plan(module, batch, float(value), optimizer=optimizer if kind == "trainplan+opt" else None,
                                 on_infeasible="raise_budget", time_limit_s=PLAN_TIME_LIMIT_S, cache_dir=cache,
                                 progress=False)
        report = planned.report
        facts = {"planned_budget_bytes": report.planned_budget_bytes, "predicted_peak_bytes": report.predicted_peak_bytes,
                 "predicted_step_s": report.predicted_step_s, "plan_status": report.status,
                 "cache_hit": report.cache_hit}
        forward = planned
        if kind.startswith("sac"):
            export = sac_policy(planned)
            export.apply(module, strict=kind == "sac")
            forward = torch.compile(module) if kind == "sac+compile" else module
            facts["sac"] = export.summary()

    def step() -> float:
        loss = built.loss_fn(forward(**batch))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss)

    if "compile" in kind:
        step()  # compiles
    return step, facts, time.perf_counter() - start


def one(model: str, method: str, repeats: int, cache: Path) -> dict[str, Any]:
    """Measure one method in this process (a fresh one)."""
    import torch

    from trainplan.execute.measure import process_peak_during
    from trainplan.timing import return_freed_memory

    torch.manual_seed(0)
    return_freed_memory()
    step, facts, setup_s = _prepared(model, method, cache)
    for _ in range(WARMUP):  # on the meter's thread too, as the measured steps
        process_peak_during(step)
    times, peaks, losses = [], [], []
    for _ in range(repeats):
        def timed() -> tuple[float, float]:
            t = time.perf_counter()
            loss = step()
            return time.perf_counter() - t, loss

        (seconds, loss), peak = process_peak_during(timed)
        times.append(seconds)
        peaks.append(peak)
        losses.append(loss)
    return {"model": model, "method": method, "setup_s": setup_s, "step_s": times, "peak_bytes": peaks,
            "losses": losses, **facts}


def run_process(model: str, method: str, repeats: int, cache: Path) -> dict[str, Any]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    out = subprocess.run([sys.executable, __file__, "one", model, method, "--repeats", str(repeats),
                          "--cache", str(cache)], capture_output=True, text=True, cwd=ROOT, env=env)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        return {"model": model, "method": method, "error": " | ".join(tail)}
    return json.loads(line.removeprefix("RESULT "))


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row per (model, method): medians over every step of every process, and the spread."""
    first = runs[0]
    if "error" in first:
        return {"model": first["model"], "method": first["method"], "error": first["error"]}
    steps = [s for r in runs for s in r["step_s"]]
    peaks = [p for r in runs for p in r["peak_bytes"]]
    row = {"model": first["model"], "method": first["method"], "peak_mib": statistics.median(peaks) / 2**20,
           "peak_min_mib": min(peaks) / 2**20, "peak_max_mib": max(peaks) / 2**20,
           "step_s": statistics.median(steps), "step_min_s": min(steps), "step_max_s": max(steps),
           "setup_s": statistics.median(r["setup_s"] for r in runs), "loss": first["losses"][0], "processes": len(runs)}
    for key in ("planned_budget_bytes", "predicted_peak_bytes", "predicted_step_s", "plan_status", "sac"):
        if key in first:
            row[key] = first[key]
    return row


def frontier_verdict(rows: list[dict[str, Any]]) -> list[str]:
    """For each competitor point: one of ours (a plan, or torch.compile with our knapsack solver) with peak <= and
    time <= it, or the point it lacks."""
    lines = []
    ours = [r for r in rows if r["method"].startswith(OURS) and "error" not in r]
    for r in rows:
        if r["method"].startswith(OURS) or "error" in r:
            continue
        win = [o for o in ours if o["model"] == r["model"] and o["peak_mib"] <= r["peak_mib"] and o["step_s"] <= r["step_s"]]
        verdict = f"dominated by {win[0]['method']}" if win else "NOT dominated"
        lines.append(f"- {r['model']} {r['method']} ({r['peak_mib']:.1f} MiB, {r['step_s']:.3f} s): {verdict}")
    return lines


def write(rows: list[dict[str, Any]], header: str, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    frame = pd.DataFrame(rows)
    frame.to_csv(OUT / f"{name}.csv", index=False)
    fig, axes = plt.subplots(1, frame.model.nunique(), figsize=(6 * frame.model.nunique(), 4.5), squeeze=False)
    measured = frame[frame["error"].isna()] if "error" in frame else frame
    for ax, (model, part) in zip(axes[0], measured.groupby("model")):
        for family, marker in (("eager", "s"), ("hf_checkpointing", "^"), ("compile", "o"), ("compile+exact", "D"),
                               ("trainplan", "x"), ("trainplan+opt", "*"), ("sac", "P"),
                               ("sac+compile", "h")):
            pts = part[part.method.str.split("@").str[0] == family]
            ax.errorbar(pts.peak_mib, pts.step_s, yerr=[pts.step_s - pts.step_min_s, pts.step_max_s - pts.step_s],
                        fmt=marker, label=family, capsize=3)
        ax.set(title=model, xlabel="measured peak above inputs (MiB)", ylabel="step time (s, median; bars: min-max)")
        ax.legend(fontsize=8)
    fig.suptitle("Memory/time frontier\none meter (process high-water mark), a fresh process per method", fontsize=9)
    fig.tight_layout()
    fig.savefig(OUT / f"{name}.png", dpi=120)
    cols = ["model", "method", "peak_mib", "peak_min_mib", "peak_max_mib", "step_s", "step_min_s", "step_max_s",
            "setup_s", "planned_budget_bytes", "plan_status", "error"]
    table = frame[[c for c in cols if c in frame]].to_markdown(index=False, floatfmt=".3f")
    verdict = "\n".join(frontier_verdict(rows))
    (OUT / f"{name}.md").write_text(
        f"# trainplan against PyTorch's memory tools\n\n{header}\n\n{table}\n\n## Frontier\n\n{verdict}\n\n"
        f"![frontier]({name}.png)\n\n*Each point: one method's median step time against its median measured "
        "peak above the parameters, batch and optimizer state; bars: the min-max step time over every measured "
        "step.*\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    one_p = sub.add_parser("one")
    one_p.add_argument("model")
    one_p.add_argument("method")
    one_p.add_argument("--repeats", type=int, default=5)
    one_p.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--models", nargs="+", default=["gpt2"], choices=sorted(MODELS))
    parser.add_argument("--repeats", type=int, default=5, help="measured steps per process")
    parser.add_argument("--processes", type=int, default=1, help="fresh processes per method")
    parser.add_argument("--methods", nargs="*", help="a subset of the methods (default: all)")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/trainplan-bench-plans"))
    parser.add_argument("--name", default="vs_pytorch", help="file stem of the tables and figure in bench/results/")
    args = parser.parse_args()
    if args.command == "one":
        print("RESULT " + json.dumps(one(args.model, args.method, args.repeats, args.cache)))
        return
    rows = []
    for model in args.models:
        for method in args.methods or methods(model):
            runs = [run_process(model, method, args.repeats, args.cache) for _ in range(args.processes)]
            rows.append(summarize(runs))
            print(json.dumps(rows[-1]), flush=True)
    import torch

    header = (f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads; AdamW; "
              f"{args.repeats} steps x {args.processes} process(es) per method after {WARMUP} warm-ups; "
              f"`python bench/bench_vs_pytorch.py --models {' '.join(args.models)} --repeats {args.repeats} "
              f"--processes {args.processes}{' --methods ' + ' '.join(args.methods) if args.methods else ''}`, run alone on the machine")
    write(rows, header, args.name)


if __name__ == "__main__":
    main()
