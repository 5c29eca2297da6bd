"""Benchmark: plans for real models, compiled and run, against their predictions (targets included).

For each model x budget: the step is traced, profiled (``profile_model``, as the profile rule does, on
this runtime) and planned in-process (``build_plan``: one stage, or k parts of the node list) at the budget
fraction, then validated (``validate_plan``: the compiled plan timed, median of repeats after warm-up,
alternating with the compiled no-recompute plan). Models: the default study's (GPT-2 small, ResNet-50)
and small configurations nobody tuned for (OPT, DistilBERT, ConvNeXt, Llama).

Target: on the CPU, every stage's raw measured step time within 10% of its prediction, and its measured
peak at most its budget. A stage timed while the machine was busy is ``unreliable`` (its no-recompute run
off its profiled time by more than ``load_rel``), which is not a pass. The table is written to
``bench/results/validate.md`` with the machine's load average before and after each model, so a reader
sees what was measured under load.

    nice python bench/bench_validate.py --models tiny_gpt2 opt distilbert convnext llama --budgets 0.5
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import yaml

from trainplan.execute import Tolerances, ValidateSettings, build_plan, parse_plan, split_nodes, validate_plan
from trainplan.export.tables import graph_tables
from trainplan.export.trace import trace_training_step
from trainplan.models import build_model
from trainplan.profile.op_times import profile_model

RESULTS = Path(__file__).resolve().parent / "results" / "validate.md"
MIB = 2**20
TIME_TARGET = 0.10
#: small configurations of architectures the project was not tuned on (random weights, no downloads)
HELD_OUT: dict[str, dict[str, Any]] = {
    "tiny_gpt2": {"architecture": "GPT2LMHeadModel",
                  "config": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512, "n_positions": 64},
                  "inputs": {"batch_size": 2, "seq_len": 16}},
    "opt": {"architecture": "OPTForCausalLM",
            "config": {"hidden_size": 256, "ffn_dim": 1024, "num_hidden_layers": 4, "num_attention_heads": 4,
                       "vocab_size": 8192, "max_position_embeddings": 256, "word_embed_proj_dim": 256},
            "inputs": {"batch_size": 2, "seq_len": 128}},
    "distilbert": {"architecture": "DistilBertForMaskedLM",
                   "config": {"dim": 256, "hidden_dim": 1024, "n_layers": 4, "n_heads": 4, "vocab_size": 8192},
                   "inputs": {"batch_size": 2, "seq_len": 128}},
    "convnext": {"architecture": "ConvNextForImageClassification",
                 "config": {"hidden_sizes": [48, 96, 192, 384], "depths": [2, 2, 4, 2]},
                 "inputs": {"batch_size": 2, "image_size": 128}},
    "llama": {"architecture": "LlamaForCausalLM",
              "config": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
                         "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 8192},
              "inputs": {"batch_size": 2, "seq_len": 128}},
}


def validate_model(name: str, spec: dict[str, Any], budgets: list[float], k: int, cfg: dict[str, Any],
                   settings: ValidateSettings) -> list[dict[str, Any]]:
    """One validation document per budget for the model, each with its plan's build details."""
    built = build_model(name, spec, seed=cfg["seed"])
    traced, _ = trace_training_step(built)
    tables = graph_tables(traced)
    device = cfg["devices"][cfg["device"]]
    prof = profile_model(built, tables.nodes, device=device, repeats=cfg["profile"]["repeats"],
                         warmup=cfg["profile"]["warmup"], progress=False)
    nodes = tables.nodes.merge(prof.ops[["name", "time_s"]], on="name", validate="one_to_one")
    solver = cfg["solver"]
    reports = []
    for budget in budgets:
        plan = build_plan(nodes, tables.tensors, split_nodes(nodes.name.tolist(), k), model=name,
                          device=cfg["device"], fraction=budget, bandwidth=prof.summary["host_link_bytes_per_s"],
                          time_limit_s=solver["time_limit_s"], workers=solver["workers"], seed=solver["seed"])
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        report = validate_plan(built, plan, parse_plan(plan, name), tables.tensors,
                               export_names=tables.nodes.name.tolist(), settings=settings,
                               link_sizes=(prof.summary.get("host_link") or {}).get("sizes")).report
        report.update(validate_seconds=time.perf_counter() - start, loadavg=(load_before, os.getloadavg()[0]),
                      profile_time_scale=prof.summary["time_scale"])
        reports.append(report)
    return reports


def rows(report: dict[str, Any]) -> list[str]:
    out = []
    lo, hi = report["loadavg"]
    for st in report["stages"]:
        on_target = "yes" if st["status"] != "unreliable" and abs(st["time_rel_err"]) <= TIME_TARGET \
            and st["over_budget_rel"] <= 0 else ("n/a (busy)" if st["status"] == "unreliable" else "no")
        out.append(
            f"| {report['model']} | {report['k']} | {report['budget_fraction']} | {st['index']} "
            f"| {st['predicted_peak_bytes'] / MIB:.2f} | {st['measured_peak_bytes'] / MIB:.2f} "
            f"| {st['budget_bytes'] / MIB:.2f} | {st['over_budget_rel']:+.2%} "
            f"| {st['predicted_time_s']:.4f} | {st['measured_time_s']:.4f} | {st['time_rel_err']:+.1%} "
            f"| {st['load_factor']:.2f} | {st['time_rel_err_load_adjusted']:+.1%} | {lo:.1f}-{hi:.1f} "
            f"| {report['timing_attempts']} | {st['status']} | {on_target} |")
    if not report["stages"]:
        out.append(f"| {report['model']} | {report['k']} | {report['budget_fraction']} |" + " - |" * 13
                   + f" {report['status']} | no |")
    return out


HEADER = ("| model | k | budget | stage | predicted peak MiB | measured peak MiB | budget MiB | over budget "
          "| predicted s | measured s | time err (raw) | load | time err (load-adj.) | loadavg | attempts "
          "| status | on target |\n|" + "---|" * 17)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--models", nargs="+", default=["gpt2", "resnet50", *HELD_OUT],
                        help=f"names in the config or held-out configurations ({', '.join(HELD_OUT)})")
    parser.add_argument("--budgets", nargs="+", type=float, default=[0.5])
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=None, help="default: config validate.repeats")
    parser.add_argument("--attempts", type=int, default=None, help="default: config validate.attempts")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    cfg = yaml.safe_load(Path(args.config).read_text())
    val = cfg.get("validate", {})
    torch.set_num_threads(val.get("threads", 2))
    settings = ValidateSettings(repeats=args.repeats or val.get("repeats", 3), warmup=val.get("warmup", 1),
                                device=cfg["devices"][cfg["device"]]["type"],
                                tolerances=Tolerances(**val.get("tolerances", {})),
                                attempts=args.attempts or val.get("attempts", 3))
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines: list[str] = []
    reasons: list[str] = []
    for done, name in enumerate(args.models, start=1):
        spec = cfg["models"].get(name) or HELD_OUT[name]
        for report in validate_model(name, spec, args.budgets, args.k, cfg, settings):
            lines += rows(report)
            reasons += [f"- {name} b={report['budget_fraction']}: {r[:300]}"
                        for r in report["reasons"] + report.get("unreliable", [])]
            print("\n".join(rows(report)), flush=True)
        write_table_md(args.out, started, settings, args.k, lines, reasons, args.models[done:])
    print(f"written {args.out}")


def write_table_md(out: Path, started: str, settings: ValidateSettings, k: int, lines: list[str],
                   reasons: list[str], pending: list[str]) -> None:
    """The bench's Markdown file, rewritten after every model (``pending``: models not run yet)."""
    cpus = os.cpu_count()
    text = "\n".join([
        "# Validation bench: compiled plans, raw measured step time vs predicted (written by bench/bench_validate.py)",
        "",
        f"Run {started} on {platform.machine()} with {cpus} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {settings.repeats} timed runs after {settings.warmup} warm-up, "
        f"at most {settings.attempts} timing attempts; k = {k}. Target: raw time error within "
        f"{TIME_TARGET:.0%} and measured peak at most the budget. `loadavg`: the 1-minute load average before "
        f"and after each validation; above {cpus} the machine was shared and every time here is **measured "
        "under load** (`load`: the compiled no-recompute run's time over its profiled time, timed beside the plan).",
        "",
        HEADER,
        *lines,
        "",
        *([f"Not run yet when this file was written: {', '.join(pending)}.", ""] if pending else []),
        "Reasons and unreliable notes:",
        "",
        *(reasons or ["- none"]),
        "",
    ])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


if __name__ == "__main__":
    main()
