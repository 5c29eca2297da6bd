"""Benchmark: partition methods run as real pipelines (issue #53, item 3).

For each model x budget: the step is traced and profiled in-process (``profile_model``, as the profile rule does,
with ``--threads`` torch threads, the ranks' count) and split into k stages by each method
(``trainplan.pipeline.compare``): the partitions a user would otherwise get (``even_blocks``: blocks split evenly;
``ds_uniform`` and ``ds_parameters``: DeepSpeed's partition methods over the layers; ``exact_dp``: the exact
min-max split of the profiled times, PipeDream's) and ``ours`` (the balance rule's plan, with the config's
``balance`` settings). For each schedule and micro-batch count, every partition's stages are scheduled at the same
budget for that schedule and m (their in-flight micro-batches held in each rank's budget), written as a plan.json
and run as a pipeline (k torchrun processes, gloo) with them.
Methods whose cuts coincide run once (``same_as``).

Writes ``<out>.csv`` (a row per model, budget, method, schedule, m), ``<out>.md`` (tables, the fastest method
per setting, ours against the fastest other one, the host's load) and ``<out>.png`` (predicted against measured
step time per method, a panel per setting). Plans and run artifacts go under ``<out>_plans/``.

    nice python bench/bench_pipeline.py                                     # the grid below (hours on 2 cores)
    python bench/bench_pipeline.py --config tests/config/config.yaml --models tiny_gpt2 --budgets 0.6 \\
        --micro-batches 2 --schedules 1f1b --repeats 1 --out /tmp/pipeline       # a smoke run
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from host_load import load_label
from trainplan.artifacts import PROFILE_COLUMNS, with_measured_workspaces
from trainplan.budget import parse_budget
from trainplan.export.tables import graph_tables
from trainplan.export.trace import trace_training_step
from trainplan.io import atomic_path, merged_yaml, write_json, write_table
from trainplan.memory_model import memory_model
from trainplan.models import build_model
from trainplan.partition import BalanceSettings, MemoryLimit, SolverSettings
from trainplan.pipeline.compare import ALL_METHODS, OURS, comparison_row, method_plans, run_plan
from trainplan.pipeline.plot import plot_methods
from trainplan.pipeline.run import RunSettings
from trainplan.profile.op_times import profile_model
from trainplan.schedule.pipeline_hold import MULTI_STAGE

REPO = Path(__file__).resolve().parents[1]
#: a small Llama (bench_validate.py's): an architecture the default study does not plan
EXTRA_MODELS: dict[str, dict[str, Any]] = {
    "llama": {"architecture": "LlamaForCausalLM",
              "config": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
                         "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 8192},
              "inputs": {"batch_size": 2, "seq_len": 128}},
}


def profiled(name: str, spec: dict[str, Any], args: argparse.Namespace) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """The op table with profiled times, the tensor table and the host link's bandwidth of ``name`` on the CPU, as
    the export and profile rules make them (``args.threads`` torch threads)."""
    built = build_model(name, spec, seed=args.seed)
    traced, _ = trace_training_step(built)
    tables = graph_tables(traced)
    result = profile_model(built, tables.nodes, device={"type": "cpu", "host_link_gbytes_per_s": "measured"},
                           repeats=args.profile_repeats, warmup=1, progress=False)
    nodes = with_measured_workspaces(tables.nodes.merge(result.ops[PROFILE_COLUMNS], on="name", validate="one_to_one"))
    return nodes, tables.tensors, float(result.summary["host_link_bytes_per_s"])


def model_rows(name: str, spec: dict[str, Any], config: dict[str, Any], args: argparse.Namespace,
               loads: list[float]) -> list[dict[str, Any]]:
    """Every budget, method, schedule and m of one model."""
    nodes, tensors, bandwidth = profiled(name, spec, args)
    settings = BalanceSettings(**config["balance"])
    memory = MemoryLimit(int(config["devices"]["cpu"]["memory_gib"] * 2**30), settings.micro_batches)
    model = memory_model("cpu", None)
    grid = [(s, m) for s in args.schedules for m in args.micro_batches if s != "1f1b" or m >= args.k]
    v = {s: args.stages_per_rank if s in MULTI_STAGE else 1 for s in args.schedules}
    rows = []
    for budget, (schedule, m) in ((b, g) for b in args.budgets for g in grid):
        # every method's stages budgeted for this schedule and m: its in-flight micro-batches held in each rank's
        # budget (several stages per rank: the rank's budget is theirs summed)
        plans = method_plans(name, "cpu", nodes, tensors, args.k, parse_budget(budget), bandwidth=bandwidth,
                             swaps=model.swaps, solver=SolverSettings(args.time_limit, 1, args.seed), allocation="cpu",
                             settings=replace(settings, micro_batches=m, schedule=schedule), memory=memory,
                             methods=tuple(args.methods), stages_per_rank=v[schedule])
        runs: dict[str, dict[str, Any]] = {}  # method run -> artifact
        for method, plan in plans.items():
            where = Path(f"{args.out}_plans") / name / f"k{args.k}" / f"b{budget}" / f"{schedule}_m{m}" / method
            ran = plan.get("same_as") or method
            if "error" not in plan and ran not in runs:
                write_json(where / "plan.json", {**plan, "memory_model": model.to_dict()})
                run_settings = RunSettings(where / "plan.json", name, spec, schedule, m, where / "run.json", args.seed,
                                           args.warmup, args.threads, False, "cpu", args.repeats, args.tied_grads,
                                           v[schedule])
                runs[ran] = run_plan(where / "plan.json", run_settings, run_settings.ranks(args.k))
            rows.append({"model": name, "budget": budget, "method": method, "schedule": schedule, "m": m,
                         **comparison_row(plan, runs.get(ran, {}))})
            loads.append(os.getloadavg()[0])
            print(f"{name} b{budget} {method} {schedule} m={m}: "
                  f"{rows[-1].get('measured_step_s', rows[-1].get('error'))}", flush=True)
    return rows


def markdown(frame: pd.DataFrame, args: argparse.Namespace, load: str, seconds: float) -> str:
    """The report: settings, one table per model, budget, schedule and m, the fastest method of each."""
    lines = [
        "# Partition methods run as pipelines (bench/bench_pipeline.py)", "",
        f"`{' '.join(['python', 'bench/bench_pipeline.py', *sys.argv[1:]])}`", "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, torch {torch.__version__}, "
        f"k={args.k}, {args.threads} thread(s) per rank, {args.repeats} measured step(s) (median) after "
        f"{args.warmup} warm-up, solver {args.time_limit} s per stage, tied gradients reduced once per "
        f"{args.tied_grads.replace('_', '-')}; {load}; {seconds / 60:.1f} min.", "",
        "Every method's stages scheduled at the same budget for the schedule and m they run with (each rank's "
        "budget holds that schedule's in-flight micro-batches; interleaved1f1b: its stages' budgets summed over the "
        f"{args.stages_per_rank} a rank runs). Predicted: the balance rule's (m + k - 1) t_max (with v stages "
        "per rank on R = k / v ranks: m max_r sum_(s on r) t_s + (R - 1) t_max); +comm: (m + k - 1) max_s (t_s + "
        "c_s) + r, c_s the stage's measured send/recv per micro-batch (v > 1: docs/pipeline_run.md), r the "
        "measured once-per-step tied reduction (docs/pipeline_run.md); "
        "simulated: the schedule's own action order with each stage's forward and backward measured alone, the "
        "measured transfers and r (trainplan.pipeline.simulate). Methods with the same cuts ran once "
        "(`same_as`). Memory per rank: its status against the rank's budget (`met`, or `raised` to its predicted "
        "peak), the predicted peak (schedule peak + gradient sums + carriers + the other in-flight stashes), the "
        "tensors metered (torch's allocator), what the process held (fixed bytes + its resident memory's rise) "
        "and the budget.", "",
    ]
    cols = ["method", "cuts", "same_as", "planned_rate", "predicted_step_s", "predicted_step_comm_s", "measured_step_s",
            "measured_over_predicted_comm", "simulated_step_s", "measured_over_simulated", "co_run_slowdown",
            "rank_status",
            "rank_predicted_mib", "tensor_peak_mib", "held_peak_mib", "budget_mib", "error"]
    for (model, budget, schedule, m), part in frame.groupby(["model", "budget", "schedule", "m"], sort=False):
        lines += [f"## {model}, budget {budget}, {schedule}, m={m}", "",
                  part.reindex(columns=cols).astype(object).fillna("").to_markdown(index=False, floatfmt=".4g"), ""]
        done = part.dropna(subset=["measured_step_s"]) if "measured_step_s" in part else part.iloc[:0]
        if done.empty:
            continue
        best = done.loc[done.measured_step_s.idxmin()]
        line = f"Fastest measured: **{best.method}** ({best.measured_step_s:.4g} s)."
        ours = done[done.method == OURS]
        if not ours.empty:
            others = done[(done.method != OURS) & (done.cuts != ours.cuts.iloc[0])]
            if others.empty:
                line += " Every other method made our partition."
            else:
                other = others.loc[others.measured_step_s.idxmin()]
                ratio = ours.measured_step_s.iloc[0] / other.measured_step_s
                line += (f" Ours {ours.measured_step_s.iloc[0]:.4g} s against the fastest other partition "
                         f"({other.method}) {other.measured_step_s:.4g} s: x{ratio:.3f}.")
        lines += [line, ""]
    lines += [f"![methods]({Path(args.out).name}.png)", "",
              "*Per setting and method: the measured step time (median; whiskers: the fastest and slowest measured "
              "step), the balance rule's prediction (open diamond) and the prediction with the measured send/recv "
              "(filled diamond).*"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=None,
                    help="a config layered over config/config.yaml, as --configfile is: its models, balance block "
                         "and devices.cpu memory are used (llama is added)")
    ap.add_argument("--models", nargs="+", default=["gpt2", "resnet50", "llama"])
    ap.add_argument("--k", type=int, default=2, help="stages (ranks; under interleaved1f1b k / stages-per-rank)")
    ap.add_argument("--budgets", nargs="+", default=["0.7", "0.5"])
    ap.add_argument("--micro-batches", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--schedules", nargs="+", choices=["gpipe", "1f1b", "interleaved1f1b"], default=["gpipe", "1f1b"])
    ap.add_argument("--stages-per-rank", type=int, default=2, help="interleaved1f1b: stages per rank")
    ap.add_argument("--methods", nargs="+", choices=ALL_METHODS, default=list(ALL_METHODS))
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank (and of the profile)")
    ap.add_argument("--repeats", type=int, default=3, help="measured steps per run (median)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--profile-repeats", type=int, default=5)
    ap.add_argument("--time-limit", type=float, default=10.0, help="solver seconds per stage schedule")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tied-grads", choices=["step", "micro_batch"], default="step",
                    help="tied weights' partial gradients sent once per step or in every micro-batch's carrier")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "pipeline"),
                    help="writes OUT.csv, OUT.md, and plans and runs under OUT_plans/")
    args = ap.parse_args()
    config = merged_yaml([REPO / "config" / "config.yaml", *([args.config] if args.config else [])])
    models = {**EXTRA_MODELS, **config["models"]}
    unknown = [m for m in args.models if m not in models]
    if unknown:
        ap.error(f"unknown model(s) {unknown}: not in the config's models nor {sorted(EXTRA_MODELS)}")
    torch.set_num_threads(args.threads)
    start, loads = time.perf_counter(), [os.getloadavg()[0]]
    rows = [row for name in args.models for row in model_rows(name, models[name], config, args, loads)]
    frame = pd.DataFrame(rows)
    write_table(f"{args.out}.csv", frame)
    plot_methods(frame, f"{args.out}.png")
    with atomic_path(f"{args.out}.md") as tmp:
        tmp.write_text(markdown(frame, args, load_label(loads), time.perf_counter() - start) + "\n")
    print(f"wrote {args.out}.csv, {args.out}.md and {args.out}.png")


if __name__ == "__main__":
    main()
