"""Benchmark: plans on the fused models next to the raw ones, through the workflow (issue #52, items 3 and 4).

For the models given, the default config with ``study.plan`` = those models (every other study empty),
``stages: [1]``, the budgets, ``fuse.plan: [<target>]`` (``--target``: Inductor's table, or it without the matrix
products) and the solver's time limit is run by Snakemake in a
scratch folder (``--cores 2``) up to ``results/fuse/cpu/plan_compare.csv``: each model exported, profiled,
scheduled, balanced and validated (executed) twice, on its raw ops and with its forward groups as fused ops
(docs/fuse.md). ``llama24`` is a 24-layer Llama-style model at small width: the scale model, its training step
3.4x GPT-2 small's ops.

Writes ``<out>.csv`` (the rule's table), ``<out>.md`` (settings, host speed and load, the table, the issue's
targets read off it) and ``<out>.png`` (the rule's figure); the run's logs stay in ``<out>_run/``.

    python bench/bench_fuse_plan.py                                   # GPT-2 small and llama24 at 0.7 and 0.5
    python bench/bench_fuse_plan.py --models gpt2 --budgets 0.7 --out /tmp/fuse_plan
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from host_load import load_label, matmul_gflops
from trainplan.budget import parse_budget

REPO = Path(__file__).resolve().parents[1]
#: models the default config does not hold
EXTRA_MODELS: dict[str, dict[str, Any]] = {
    "llama24": {"source": "transformers", "architecture": "LlamaForCausalLM",
                "config": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 24,
                           "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 8192},
                "inputs": {"batch_size": 2, "seq_len": 256}},
}
TARGET = "results/fuse/cpu/plan_compare.csv"


def study_config(base: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The default config planning only ``args.models``, raw and fused, at one stage."""
    config = copy.deepcopy(base)
    config["models"].update({m: spec for m, spec in EXTRA_MODELS.items() if m in args.models})
    missing = [m for m in args.models if m not in config["models"]]
    if missing:
        raise SystemExit(f"unknown model(s) {missing}: neither in {args.config} nor in {sorted(EXTRA_MODELS)}")
    config["study"] = {key: [] for key in config["study"]} | {"plan": list(args.models)}
    config["stages"] = [1]
    config["budgets"] = [b if parse_budget(b).bytes is not None else float(b) for b in args.budgets]
    config["fuse"]["targets"][args.target] = {"builtin": args.target}
    config["fuse"]["plan"] = [args.target]
    config["solver"]["time_limit_s"] = args.time_limit
    config["device"] = "cpu"
    return config


def run_workflow(config_file: Path, workdir: Path, loads: list[float]) -> float:
    """Snakemake up to the comparison table; the 1-minute load average sampled every 10 s into ``loads``."""
    done = threading.Event()

    def sample() -> None:
        while not done.wait(10):
            loads.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    cmd = ["snakemake", "--cores", "2", "--snakefile", str(REPO / "Snakefile"), "--configfile", str(config_file),
           "--directory", str(workdir), TARGET]
    with open(workdir / "snakemake.log", "w") as log:
        code = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    done.set()
    if code:
        raise SystemExit(f"the workflow failed (exit {code}); its log: {workdir / 'snakemake.log'}")
    return time.perf_counter() - start


def targets(table: pd.DataFrame) -> list[str]:
    """Issue #52's targets, read off the fused rows (their ``*_vs_raw`` ratios)."""
    lines = []
    for row in table[table.graph != "raw"].itertuples():
        raw = table[(table.model == row.model.split("+")[0]) & (table.graph == "raw") & (table.k == row.k)
                    & (table.budget == row.budget)]
        raw_peak = float(raw.counted_peak_bytes.iloc[0]) if len(raw) else float("nan")
        lines.append(
            f"- {row.model.split('+')[0]}, budget {row.budget}: scheduling ops x{row.problem_ops_vs_raw:.2f} of raw's "
            f"(target <= 0.2), step ops x{row.graph_ops_vs_raw:.2f}; solve x{row.solve_s_vs_raw:.2f} of raw's "
            f"(target <= 0.33); measured step x{row.measured_s_vs_raw:.3f} (target < 1); measured peak (all the run "
            f"holds) {row.counted_peak_bytes / 2**20:.1f} MiB against raw's {raw_peak / 2**20:.1f} MiB, budget "
            f"{row.budget_bytes / 2**20:.1f} MiB ({row.budget_status}; validation {row.status}); gradients against the "
            f"unfused model's (both against float64) at {row.grad_check_ratio:.3g} of the tolerance"
            + ("" if pd.isna(row.grad_float64_rel_err) else
               f", the groups in float64 at {row.grad_float64_rel_err:.2g} of the float64 step's")
            + f" ({'passed' if row.grads_passed == True else 'failed'})")  # noqa: E712 (read from a CSV)
    return lines


def markdown(table: pd.DataFrame, args: argparse.Namespace, seconds: float, gflops: float, load: str) -> str:
    cols = ["model", "graph", "budget", "graph_ops", "problem_ops", "groups_fused", "groups_fx", "ops_fused",
            "solve_s", "planned_s", "measured_s", "budget_bytes", "peak_bytes", "measured_peak_bytes",
            "counted_peak_bytes", "recomputes", "budget_status", "status", "grad_check_ratio",
            "grad_float64_rel_err", "grads_passed"]
    shown = table[[c for c in cols if c in table]].copy()
    for c in ("budget_bytes", "peak_bytes", "measured_peak_bytes", "counted_peak_bytes"):
        shown[c] = (shown[c] / 2**20).round(1)
    shown = shown.rename(columns={"budget_bytes": "budget_mib", "peak_bytes": "peak_mib",
                                  "measured_peak_bytes": "measured_peak_mib", "counted_peak_bytes": "counted_peak_mib"})
    return "\n".join([
        "# Plans on the fused models against the raw ones (bench/bench_fuse_plan.py)", "",
        f"`{' '.join(['python', 'bench/bench_fuse_plan.py', *sys.argv[1:]])}`", "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, fused with `{args.target}`, one stage, "
        f"solver {args.time_limit} s, the workflow at --cores 2; {load}; host speed {gflops:.0f} GFLOP/s (2048 x 2048 "
        f"fp32 matmul, 2 threads) at the start; {seconds / 60:.1f} min.", "",
        "Columns as `results/fuse/cpu/plan_compare.csv` (docs/fuse.md): `graph_ops` the traced step's ops, "
        "`problem_ops` the scheduling ops, `solve_s` our solver (schedule rule), `planned_s` the plan's predicted "
        "step and `measured_s` the validate rule's measured one (median), peaks in MiB: predicted, measured over the "
        "storages the plan's events hold, and counted (all the run holds: the process's, a fused op's temporaries "
        "inside its kernels included).", "",
        shown.to_markdown(index=False, floatfmt=".4g"), "",
        "Targets (issue #52):", "", *targets(table), "",
        f"![plan_compare]({Path(args.out).name}.png)", "",
        "*Per model and budget: scheduling ops, our solve time, planned and measured step time and peaks of the "
        "plan on the raw graph and on the fused one.*", ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "config" / "config.yaml"))
    ap.add_argument("--models", nargs="+", default=["gpt2", "llama24"])
    ap.add_argument("--budgets", nargs="+", default=["0.7", "0.5"],
                    help="fractions of each graph's own no-recompute peak (0.5) or bytes, the same for both (280MiB)")
    ap.add_argument("--target", default="inductor", choices=["inductor", "inductor-no-matmul"],
                    help="the support table the fused model is grouped with (docs/fuse.md)")
    ap.add_argument("--time-limit", type=float, default=5.0, help="the solver's limit per schedule (s)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "fuse_plan"))
    args = ap.parse_args()
    out = Path(args.out)
    workdir = out.parent / f"{out.name}_run"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    config_file = workdir / "config.yaml"
    config_file.write_text(yaml.safe_dump(study_config(yaml.safe_load(Path(args.config).read_text()), args)))
    gflops = matmul_gflops()
    loads = [os.getloadavg()[0]]
    seconds = run_workflow(config_file, workdir, loads)
    table = pd.read_csv(workdir / TARGET)
    table.to_csv(out.with_suffix(".csv"), index=False)
    shutil.copyfile(workdir / "results/plots/fuse/cpu/plan_compare.png", out.with_suffix(".png"))
    out.with_suffix(".md").write_text(markdown(table, args, seconds, gflops, load_label(loads, fills_cores=True)))
    print(f"wrote {out}.csv, {out}.md and {out}.png")


if __name__ == "__main__":
    main()
