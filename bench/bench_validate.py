"""Benchmark: execute plans for real models and compare them with their predictions.

For each model x budget x stage count: the balance rule's plan when it exists
(``results/balance/{model}/{device}/k{k}/b{budget}/plan.json``), else a plan built in-process
(stage_problem + budget_for + solve on the exported, profiled graph; k > 1 splits the node list) and
cached under ``results/validate/_bench/plans/``. Prints a Markdown table; writes every validation
document to ``results/validate/_bench/``.

    python bench/bench_validate.py --models gpt2 resnet50 --budgets 0.7 0.5 --k 1
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from trainplan.artifacts import read_host_link, read_host_link_sizes, read_profiled_graph
from trainplan.execute import Tolerances, ValidateSettings, build_plan, parse_plan, split_nodes, validate_plan
from trainplan.io import read_json, write_json
from trainplan.models import build_model

OUT = Path("results/validate/_bench")
MIB = 2**20


def plan_for(model: str, device: str, k: int, budget: float, cfg: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(plan, where it came from): the balance rule's, a cached one, or a freshly built one."""
    balance = Path(f"results/balance/{model}/{device}/k{k}/b{budget}/plan.json")
    if balance.exists():
        return read_json(balance), str(balance)
    cached = OUT / "plans" / f"{model}_k{k}_b{budget}.json"
    if cached.exists():
        return read_json(cached), str(cached)
    exp, prof = f"results/export/{model}/{cfg['devices'][device]['type']}", f"results/profile/{model}/{device}"
    graph = read_profiled_graph(f"{exp}/nodes.parquet", f"{exp}/tensors.parquet", f"{exp}/graph.json", f"{prof}/ops.parquet")
    solver = cfg["solver"]
    plan = build_plan(graph.nodes, graph.tensors, split_nodes(graph.nodes.name.tolist(), k), model=model,
                      device=device, fraction=budget, bandwidth=read_host_link(f"{prof}/summary.json"),
                      time_limit_s=solver["time_limit_s"], workers=solver["workers"], seed=solver["seed"])
    write_json(cached, plan)
    return plan, f"built ({cached})"


def row(report: dict[str, Any]) -> str:
    cells = []
    for st in report["stages"]:
        grads = report["gradients"]["vs_compiled_step"]
        cells.append(
            f"| {report['model']} | {report['k']} | {report['budget_fraction']} | {st['index']} "
            f"| {st['predicted_peak_bytes'] / MIB:.1f} | {st['measured_peak_bytes'] / MIB:.1f} | {st['peak_rel_err']:+.1%} "
            f"| {st['budget_bytes'] / MIB:.1f} | {st['over_budget_rel']:+.1%} "
            f"| {st['predicted_time_s']:.3f} | {st['measured_time_s']:.3f} | {st['time_rel_err']:+.1%} "
            f"| {st['time_rel_err_load_adjusted']:+.1%} | {grads['max_abs_err']:.1e} | {report['status']} |"
        )
    return "\n".join(cells) or f"| {report['model']} | {report['k']} | {report['budget_fraction']} | - " + "| - " * 10 + f"| {report['status']} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--models", nargs="+", default=["gpt2", "resnet50"])
    parser.add_argument("--budgets", nargs="+", type=float, default=[0.7, 0.5])
    parser.add_argument("--k", nargs="+", type=int, default=[1])
    parser.add_argument("--repeats", type=int, default=None, help="default: config validate.repeats")
    parser.add_argument("--warmup", type=int, default=None)
    args = parser.parse_args()
    cfg = yaml.safe_load(Path(args.config).read_text())
    val = cfg.get("validate", {})
    torch.set_num_threads(val.get("threads", 2))
    device = cfg["device"]
    settings = ValidateSettings(repeats=args.repeats or val.get("repeats", 3),
                                warmup=val.get("warmup", 1) if args.warmup is None else args.warmup,
                                device=cfg["devices"][device]["type"], tolerances=Tolerances(**val.get("tolerances", {})))
    print("| model | k | budget | stage | predicted peak MiB | measured peak MiB | peak err | budget MiB "
          "| over budget | predicted s | measured s | time err | time err (load-adj.) | grad max abs err | status |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models:
        built = build_model(model, cfg["models"][model], seed=cfg.get("seed", 0))
        exp = f"results/export/{model}/{settings.device}"
        graph = read_profiled_graph(f"{exp}/nodes.parquet", f"{exp}/tensors.parquet", f"{exp}/graph.json",
                                    f"results/profile/{model}/{device}/ops.parquet")
        for k in args.k:
            for budget in args.budgets:
                plan, source = plan_for(model, device, k, budget, cfg)
                start = time.perf_counter()
                result = validate_plan(built, plan, parse_plan(plan, source), graph.tensors,
                                       export_names=graph.nodes.name.tolist(), settings=settings,
                                       link_sizes=read_host_link_sizes(f"results/profile/{model}/{device}/summary.json"))
                result.report["plan_source"] = source
                result.report["validate_seconds"] = time.perf_counter() - start
                write_json(OUT / f"{model}_k{k}_b{budget}.json", result.report)
                print(row(result.report), flush=True)
                for reason in result.report["reasons"]:
                    print(f"<!-- {model} k={k} b={budget}: {reason[:400]} -->", flush=True)


if __name__ == "__main__":
    main()
