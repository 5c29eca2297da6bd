"""Benchmark: does fp16 alignment padding make ops faster or slower on a device? Writes
bench/results/align_speed_<device>.md and .csv.

    python bench/bench_align_speed.py [--device cuda] [--configfile config/config.yaml config/cuda.yaml]
        [--models gpt2 resnet50] [--granularities 16 128] [--repeats 7] [--warmup 3] [--calls 10]

Each model's training step is traced on the device and run once at the precision of the starting policy
(`overflow.policy`), with the device's own fp16 kernels (tensor cores on a GPU, no fp32 emulation). Every
distinct half-precision op that the alignment plan pads at granularity g is timed three ways
(`trainplan.align.speed`): on its own shapes (`plain_s`), its computation on the padded shapes alone
(`aligned_s`: what a graph whose tensors stay padded pays) and padded on its own (`padded_run_s`: pad,
compute, unpad). Each is the median of `--repeats` runs of `--calls` back-to-back calls, the clock read after
the device finished. `step_*` columns weight each op by its occurrences in the step. The padded results are
also checked against the plain ones (bit-identical or within fp16 round-off). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from trainplan.align.classes import MATMUL_RULES
from trainplan.align.prove import proof_rows, run_padded_step
from trainplan.align.speed import OpClock
from trainplan.export.trace import trace_training_step
from trainplan.io import merged_yaml
from trainplan.models import build_model, on_device
from trainplan.precision.assign import assign_precision
from trainplan.precision.policy import load_policy

ROOT = Path(__file__).resolve().parents[1]


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads"


def model_rows(model: str, cfg: dict[str, Any], device: torch.device, granularities: list[int], clock: OpClock,
               matmul_rule: str) -> list[dict[str, Any]]:
    spec = cfg["models"][model]
    traced, flat = trace_training_step(on_device(build_model(model, spec, seed=cfg["seed"]), device))
    dtypes = assign_precision(traced.gm, load_policy(ROOT / cfg["overflow"]["policy"]), traced.loss_node).dtype
    rows = []
    for g in granularities:
        start = time.perf_counter()
        _, interp = run_padded_step(traced.gm, flat, dtypes, g, emulate_matmul=False, speed=clock, matmul_rule=matmul_rule)
        print(f"{model} g={g}: {interp.padded_ops} padded op runs in {time.perf_counter() - start:.1f} s", flush=True)
        for r in proof_rows(interp):
            if r["padded"]:
                rows.append({"model": model, "inputs": str(spec.get("inputs", {})), "granularity_bytes": g,
                             "matmul_rule": matmul_rule, **r})
    return rows


def lm_head_rows(cfg: dict[str, Any], device: torch.device, clock: OpClock, vocab_sizes: list[int]) -> list[dict[str, Any]]:
    """GPT-2's language-model head in fp16 (the three matmuls of a linear layer's forward and backward, M = tokens,
    K = width, N = vocabulary) at each vocabulary size: the alignment effect the seed's DMA rule leaves alone
    (its rows, the tokens, are already aligned)."""
    spec = cfg["models"]["gpt2"]
    tokens = spec["inputs"]["batch_size"] * spec["inputs"]["seq_len"]
    width = spec.get("config", {}).get("n_embd", 768)
    gen = torch.Generator(device=device).manual_seed(cfg["seed"])
    x = torch.randn(tokens, width, device=device, dtype=torch.float16, generator=gen)
    rows = []
    for v in vocab_sizes:
        w = torch.randn(v, width, device=device, dtype=torch.float16, generator=gen) * 0.02
        g = torch.randn(tokens, v, device=device, dtype=torch.float16, generator=gen) * 0.01
        times = {"forward_s": clock.time(lambda: x @ w.t(), device),
                 "grad_input_s": clock.time(lambda: g @ w, device),
                 "grad_weight_s": clock.time(lambda: g.t() @ x, device)}
        rows.append({"vocab": v, "vocab_mod_8": v % 8, "vocab_mod_64": v % 64, "tokens": tokens, "width": width, **times,
                     "step_s": sum(times.values())})
        del w, g
    base = rows[0]["step_s"]
    for r in rows:
        r["speedup_vs_first"] = base / r["step_s"]
    return rows


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per model and granularity: the padded ops' step time plain, on aligned shapes, padded on their own."""
    t = table.assign(step_plain_s=table.plain_s * table.occurrences, step_aligned_s=table.aligned_s * table.occurrences,
                     step_padded_run_s=table.padded_run_s * table.occurrences)
    s = t.groupby(["model", "inputs", "matmul_rule", "granularity_bytes"]).agg(
        distinct_ops=("op", "size"), op_runs=("occurrences", "sum"), all_checks_pass=("within_tolerance", "all"),
        step_plain_s=("step_plain_s", "sum"), step_aligned_s=("step_aligned_s", "sum"),
        step_padded_run_s=("step_padded_run_s", "sum")).reset_index()
    s["aligned_speedup"] = s.step_plain_s / s.step_aligned_s
    s["padded_run_speedup"] = s.step_plain_s / s.step_padded_run_s
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--configfile", nargs="+", default=[str(ROOT / "config/config.yaml")])
    ap.add_argument("--models", nargs="+", default=["gpt2", "resnet50"])
    ap.add_argument("--granularities", nargs="+", type=int, default=[16, 128])
    ap.add_argument("--matmul-rules", nargs="+", choices=MATMUL_RULES, default=list(MATMUL_RULES))
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--vocab-sizes", nargs="+", type=int, default=[50257, 50264, 50304],
                    help="GPT-2 LM-head sizes timed (the first is the model's; 0 to skip)")
    ap.add_argument("--out", default=None, help="output prefix (default bench/results/align_speed_<device type>)")
    args = ap.parse_args()
    device = torch.device(args.device)
    cfg = merged_yaml(args.configfile)
    clock = OpClock(args.repeats, args.warmup, args.calls)
    rows = [r for m in args.models for rule in args.matmul_rules
            for r in model_rows(m, cfg, device, args.granularities, clock, rule)]
    table = pd.DataFrame(rows, columns=list(rows[0]) if rows else ["model", "inputs", "granularity_bytes", "op", "cls", "strategy",
                         "occurrences", "plain_s", "aligned_s", "padded_run_s", "identical", "within_tolerance", "matmul_rule"])
    head = pd.DataFrame(lm_head_rows(cfg, device, clock, args.vocab_sizes) if args.vocab_sizes != [0] else [])
    out = args.out or str(ROOT / f"bench/results/align_speed_{device.type}")
    table.to_csv(f"{out}.csv", index=False)
    head.to_csv(f"{out}_lm_head.csv", index=False)
    s = summary(table)
    ops = table.assign(step_plain_s=table.plain_s * table.occurrences).sort_values("step_plain_s", ascending=False)
    ops = ops.assign(aligned_speedup=ops.plain_s / ops.aligned_s, padded_run_speedup=ops.plain_s / ops.padded_run_s)
    cols = ["model", "matmul_rule", "granularity_bytes", "op", "cls", "strategy", "occurrences", "plain_s", "aligned_s", "padded_run_s",
            "aligned_speedup", "padded_run_speedup", "identical", "within_tolerance"]
    text = (f"# fp16 alignment padding: op speed on {device.type}\n\n"
            f"Written by `bench/bench_align_speed.py` at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
            f"{device_name(device)}; config {' + '.join(Path(f).name for f in args.configfile)}; median of "
            f"{args.repeats} runs of {args.calls} back-to-back calls after {args.warmup} warm-up calls, clock read after "
            f"the device finished. Only the ops the plan pads at each granularity are timed (g = 16 bytes: fp16 "
            f"counts a multiple of 8, tensor-core tiles; g = 128: a multiple of 64). `aligned`: the computation on "
            f"the padded tensors alone; `padded_run`: pad + compute + unpad; `*_speedup`: plain / that (> 1 faster). "
            f"`step_*`: summed over the op's occurrences in one training step.\n\n"
            f"## Per model\n\n{s.to_markdown(index=False, floatfmt='.4g')}\n\n"
            f"## Ops, largest step share first (at most 15 per model and granularity)\n\n"
            f"{ops.groupby(['model', 'matmul_rule', 'granularity_bytes']).head(15)[cols].to_markdown(index=False, floatfmt='.4g')}\n\n"
            f"## GPT-2's LM head at vocabulary sizes (fp16 matmuls: forward, grad input, grad weight)\n\n"
            f"{head.astype({c: str for c in ('vocab', 'tokens', 'width')}).to_markdown(index=False, floatfmt='.4g') if len(head) else 'not run'}\n")
    Path(f"{out}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
