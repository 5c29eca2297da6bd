"""Benchmark: the training step with fused ops (rule ``fuse_train``) repeated in fresh processes; writes
bench/results/fuse_train.md and .csv.

    python bench/bench_fuse_train.py [--models gpt2 resnet50] [--target inductor] [--runs 3] [--rounds 15]

Each run is a new Python process (fresh heap, Inductor's cache warm after the first), so the spread between
runs shows what one run's interval does not: the host's drift between processes. Per run: the forward graph's
groups, the step speedups over eager (every compiled group, the groups measured faster, Inductor on the whole
forward) with their paired bootstrap 95% intervals, and the float64 check. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]

ONE_RUN = """
import json, sys, torch, yaml
from trainplan.fuse.support import resolve_table
from trainplan.fuse.train_step import measure_train_step
from trainplan.models import build_model
cfg = yaml.safe_load(open(sys.argv[1]))
settings = cfg["fuse"]["train"]
torch.set_num_threads(settings["threads"])
built = build_model(sys.argv[2], cfg["models"][sys.argv[2]], seed=cfg["seed"])
_, s = measure_train_step(built, resolve_table(cfg["fuse"]["targets"][sys.argv[3]]), min_ops=settings["min_ops"],
                          max_groups=settings["max_groups"], rounds=int(sys.argv[4]), warmup=settings["warmup"],
                          whole_step=True, rtol=settings["grad_rtol"], atol=settings["grad_atol"], seed=cfg["seed"])
s.pop("samples_s")
print("RESULT " + json.dumps(s, default=str))
"""


def one_run(model: str, target: str, rounds: int) -> dict:
    out = subprocess.run([sys.executable, "-c", ONE_RUN, str(ROOT / "config/config.yaml"), model, target, str(rounds)],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def row(model: str, run: int, s: dict) -> dict:
    out = {"model": model, "run": run, "groups_ge2": s["forward_graph"]["groups_ge2"],
           "largest": s["forward_graph"]["largest"], "coverage_ops": s["forward_graph"]["coverage_ops"],
           "selected": len(s["groups_selected"]), "eager_s": s["eager_step_s"]}
    for name in ("fused", "selected", "whole"):
        v = s[f"{name}_vs_eager"]
        out[f"{name}_x"] = v["speedup"]
        out[f"{name}_ci95"] = f"[{v['ci95'][0]:.3f}, {v['ci95'][1]:.3f}]"
        out[f"{name}_faster"] = v["faster"]
    out["float64_check"] = s["check_float64"]["within_tolerance"]
    out["load_before"] = s["load_average"]["before"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gpt2", "resnet50"])
    ap.add_argument("--target", default="inductor")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "bench/results/fuse_train"))
    args = ap.parse_args()
    rows = []
    for model in args.models:
        for run in range(args.runs):
            rows.append(row(model, run, one_run(model, args.target, args.rounds)))
            print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    table.to_csv(f"{args.out}.csv", index=False)
    header = (f"# Training step with fused ops ({args.target}), {args.runs} fresh processes per model\n\n"
              f"Written by `bench/bench_fuse_train.py` ({args.rounds} alternating rounds per run, threads and warmup "
              f"from config/config.yaml, {os.cpu_count()} CPUs). `*_x`: median eager step / median step; `*_ci95`: "
              "paired bootstrap 95% interval over the run's rounds; `*_faster`: interval above 1. fused: every "
              "compiled group; selected: the groups whose own forward + backward measured faster; whole: Inductor "
              "on the whole forward. `load_before`: 1-minute load average when the run's step rounds began.\n\n")
    Path(f"{args.out}.md").write_text(header + table.to_markdown(index=False, floatfmt=".3f") + "\n")


if __name__ == "__main__":
    main()
