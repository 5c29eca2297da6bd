"""Benchmark: partition + balance loop vs the exact min-max DP on the real artifacts (prints a table).

    python bench/bench_partition.py [--models gpt2 resnet50] [--ks 2 4 8] [--budget 0.5] [--time-limit S]

Solver settings, device bandwidth/memory and balance settings come from config/config.yaml unless
overridden. ``wall_s``: wall seconds of the whole loop, schedules included; ``cpu_s``: this process's CPU
seconds (all threads; CP-SAT runs ``workers`` threads); ``load``: the 1-minute load average at the end,
since other work on a shared machine inflates wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import yaml

from trainplan.artifacts import read_host_link, read_profiled_graph
from trainplan.memory_model import memory_model
from trainplan.partition import (
    BalanceSettings,
    MemoryLimit,
    SolverSettings,
    StageScheduler,
    balance,
    partition_graph,
    pipeline_graph,
    range_tables,
)
from trainplan.partition.balance import comparison
from trainplan.schedule.pipeline_hold import PipelineHold

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["model", "k", "b", "dp_opt_s", "dp_tmax_s", "ours_tmax_s", "tmax_ratio", "dp_rate", "ours_rate",
           "dp_MB", "ours_MB", "bytes_ratio", "iters", "solves", "wall_s", "cpu_s", "load"]


def run(model: str, k: int, budget: float, config: dict, time_limit_s: float, art: Path) -> dict:
    device = config["devices"][config["device"]]
    export = art / "export" / model
    graph = read_profiled_graph(export / "nodes.parquet", export / "tensors.parquet", export / "graph.json",
                                art / "profile" / model / config["device"] / "ops.parquet")
    bal = config.get("balance", {})
    settings = BalanceSettings(bal.get("threshold", 0.9), bal.get("max_iterations", 5),
                               bal.get("micro_batches", 8), bal.get("tolerance", 0.02))
    solver = config.get("solver", {})
    t0, c0 = time.perf_counter(), time.process_time()
    pg = pipeline_graph(graph.nodes, graph.tensors)
    tables = range_tables(pg)
    memory = MemoryLimit(int(device["memory_gib"] * 2**30), settings.micro_batches)
    first = partition_graph(pg, tables, k, tolerance=settings.tolerance, memory=memory)
    scheduler = StageScheduler(graph.nodes, graph.tensors, bandwidth=read_host_link(art / "profile" / model / config["device"] / "summary.json"),
                               budget=budget,
                               solver=SolverSettings(time_limit_s, solver.get("workers", 2), solver.get("seed", 0)),
                               pipeline=PipelineHold(k, settings.micro_batches),
                               swap=memory_model(device["type"], device.get("host_memory")).swaps,
                               allocation=device["type"])
    result = balance(pg, tables, first, scheduler, settings, memory)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    cmp = comparison(pg, result)
    dp, ours = result.dp, result.final
    return {
        "model": model, "k": k, "b": budget, "dp_opt_s": result.dp_bottleneck_s,
        "dp_tmax_s": dp.metrics.t_max_s, "ours_tmax_s": ours.metrics.t_max_s, "tmax_ratio": cmp["bottleneck_ratio"],
        "dp_rate": dp.metrics.rate, "ours_rate": ours.metrics.rate,
        "dp_MB": dp.boundary_bytes / 1e6, "ours_MB": ours.boundary_bytes / 1e6,
        "bytes_ratio": cmp["boundary_bytes_ratio"], "iters": len(result.iterations),
        "solves": scheduler.solved, "wall_s": wall, "cpu_s": cpu, "load": os.getloadavg()[0],
    }


def table(rows: list[dict]) -> str:
    """A Markdown table of ``rows``."""
    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.4f}" if abs(v) < 10 else f"{v:.1f}"
        return "-" if v is None else str(v)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "resnet50"])
    parser.add_argument("--ks", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--time-limit", type=float, default=None, help="per-stage solver limit (default: config)")
    parser.add_argument("--config", default=str(ROOT / "config/config.yaml"))
    parser.add_argument("--results", default=str(ROOT / "results"), help="folder holding export/ and profile/")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    config = yaml.safe_load(Path(args.config).read_text())
    limit = args.time_limit if args.time_limit is not None else config.get("solver", {}).get("time_limit_s", 10)
    rows = []
    for model in args.models:
        for k in args.ks:
            rows.append(run(model, k, args.budget, config, limit, Path(args.results)))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(f"\nper-stage solver time limit {limit} s\n")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
