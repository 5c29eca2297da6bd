"""Benchmark: the step of the fused model that plans run on (each forward group one fused op pair, as the
workflow's ``<model>+inductor`` models: ``fuse.fused_ops`` of the config) against eager and ``torch.compile`` of the
whole model, side by side in one process, in fresh processes; writes bench/results/fused_step.md and .csv.

    python bench/bench_fused_step.py [--models gpt2 resnet50] [--runs 3] [--rounds 15]

Five steps: ``eager``; ``fused`` (the fused model trained by autograd); ``planned`` and ``planned_fused`` (the raw
and the fused model as ``trainplan.plan`` runs them at budget 1.0: the traced step, no recompute, the tied
embedding's gradient summed row by row, ``export.embedding_grads``); ``compile`` (``torch.compile`` of the whole
model). They are timed in alternating rounds (the same host drift for each) after warm-up steps that compile them,
with the host's freed memory kept (as the profile and validation run). Per run: medians, speedups over eager with
paired bootstrap 95% intervals, and the share of ``torch.compile``'s gain each fused step keeps (issue #52: at
least 0.7). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]

#: the steps timed beside eager
STEPS = ("fused", "planned", "planned_fused", "compile")

ONE_RUN = """
import json, os, statistics, sys, tempfile, torch, yaml
import trainplan
from trainplan.fuse.planned import fused_model
from trainplan.fuse.train_step import alternate, speedup_vs
from trainplan.models import build_model
from trainplan.timing import keep_freed_memory
cfg = yaml.safe_load(open(sys.argv[1]))
model, rounds = sys.argv[2], int(sys.argv[3])
settings, ops = cfg["fuse"]["train"], cfg["fuse"]["fused_ops"]
torch.set_num_threads(settings["threads"])
keep_freed_memory()
spec = cfg["models"][model]
eager = build_model(model, spec, seed=cfg["seed"])
fused, batch = fused_model(model, spec, {"builtin": "inductor"}, seed=cfg["seed"], **ops)  # as the workflow's
whole = build_model(model, spec, seed=cfg["seed"])
compiled = torch.compile(whole.module)
raw = build_model(model, spec, seed=cfg["seed"])
fused_to_plan, _ = fused_model(model, spec, {"builtin": "inductor"}, seed=cfg["seed"], **ops)
cache = tempfile.mkdtemp(prefix="fused_step_plans_")
planned = trainplan.plan(raw.module, raw.batch, 1.0, loss_fn=raw.loss_fn, cache_dir=cache, progress=False)
planned_fused = trainplan.plan(fused_to_plan, batch, 1.0, loss_fn=lambda loss: loss, cache_dir=cache,
                               progress=False)
def step(module, batch, loss_fn, params):
    def run():
        params.zero_grad(set_to_none=True)
        loss_fn(module(**batch)).backward()
    return run
def planned_step(module, batch):
    def run():
        module.zero_grad(set_to_none=True)
        module(batch).backward()
    return run
load = [os.getloadavg()[0]]
samples = alternate({"eager": step(eager.module, eager.batch, eager.loss_fn, eager.module),
                     "fused": step(fused, batch, lambda loss: loss, fused),
                     "planned": planned_step(planned, raw.batch),
                     "planned_fused": planned_step(planned_fused, batch),
                     "compile": step(compiled, whole.batch, whole.loss_fn, whole.module)},
                    rounds, settings["warmup"])  # the first warm-up round compiles
load.append(os.getloadavg()[0])
out = {name: statistics.median(s) for name, s in samples.items()}
for name in STEPS:
    out[name + "_vs_eager"] = speedup_vs(samples, "eager", name, cfg["seed"])
out["fusion"] = {k: v for k, v in fused.fusion.items() if k not in ("fused", "unfused")}
out["load"] = load
print("RESULT " + json.dumps(out))
"""


def one_run(config: str, model: str, rounds: int) -> dict:
    out = subprocess.run([sys.executable, "-c", f"STEPS = {STEPS!r}\n{ONE_RUN}", config, model, str(rounds)],
                         capture_output=True, text=True,
                         cwd=ROOT, check=True)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def row(model: str, run: int, s: dict) -> dict:
    gain = s["eager"] - s["compile"]
    out = {"model": model, "run": run, "groups_fused": s["fusion"]["groups_fused"],
           "ops_fused": s["fusion"]["ops_fused"], "eager_s": s["eager"], **{f"{k}_s": s[k] for k in STEPS}}
    for name in STEPS:
        v = s[f"{name}_vs_eager"]
        out[f"{name}_x"] = v["speedup"]
        out[f"{name}_ci95"] = f"[{v['ci95'][0]:.3f}, {v['ci95'][1]:.3f}]"
    for name in ("fused", "planned_fused"):
        out[f"{name}_kept"] = (s["eager"] - s[name]) / gain if gain > 0 else None
    out["load_before"], out["load_after"] = s["load"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "config" / "config.yaml"))
    ap.add_argument("--models", nargs="+", default=["gpt2", "resnet50"])
    ap.add_argument("--runs", type=int, default=3, help="fresh processes per model")
    ap.add_argument("--rounds", type=int, default=15, help="alternating timed rounds per process")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fused_step"))
    args = ap.parse_args()
    start = time.time()
    rows = []
    for model in args.models:
        for run in range(args.runs):
            rows.append(row(model, run, one_run(args.config, model, args.rounds)))
            print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out.with_suffix(".csv"), index=False)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start))
    lines = [
        "# The fused model's step against eager and torch.compile (bench/bench_fused_step.py)", "",
        f"`python bench/bench_fused_step.py --models {' '.join(args.models)} --runs {args.runs} "
        f"--rounds {args.rounds}`", "",
        f"{stamp}, {os.cpu_count()} CPUs, {(time.time() - start) / 60:.1f} min; one fresh process per run, the five "
        "steps alternating in it. `fused`: the model plans run on (forward groups as fused op pairs, "
        "`fuse.fused_ops` of the config), trained by autograd; `planned`, `planned_fused`: the raw and the fused "
        "model as `trainplan.plan(..., 1.0)` runs them (the traced step, no recompute); `compile`: `torch.compile` "
        "of the whole model (default options). `*_x`: median eager step / median step, with the paired bootstrap "
        "95% interval; `*_kept`: (eager - step) / (eager - compile), target >= 0.7 (issue #52); `load_*`: 1-minute "
        "load average around the rounds.", "",
        df.to_markdown(index=False, floatfmt=".4g"), ""]
    out.with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
