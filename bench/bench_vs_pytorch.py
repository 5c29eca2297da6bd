"""Benchmark: trainplan against PyTorch's own memory tools on one meter; writes bench/results/vs_pytorch.md,
.csv and .png (the memory/time frontier).

    python bench/bench_vs_pytorch.py [--models gpt2] [--repeats 5] [--processes 1] [--methods ...] [--name STEM]

Every method trains the same model (random weights, seed 0) with AdamW, one full step each time (forward, loss,
backward, ``optimizer.step()``, ``zero_grad()``), in a fresh Python process per method and process repeat
(the workflow's ``frontier`` rule runs the same code, ``trainplan.frontier``):

- ``eager``: the model as it is;
- ``hf_checkpointing``: Hugging Face's ``gradient_checkpointing_enable()`` (models that support it);
- ``compile@B``: ``torch.compile`` with ``torch._functorch.config.activation_memory_budget = B``;
- ``compile+exact@B``: the same, its partitioner's knapsack solved exactly (``trainplan.loop.knapsack``);
- ``trainplan@F``: ``trainplan.plan(model, batch, F)`` (F a fraction of the step's no-recompute peak; where no
  schedule meets it, the least budget found: ``planned_budget_bytes`` says which), gradients to ``.grad``;
- ``trainplan+opt@F``: the same with the optimizer in the plan (``optimizer=``): each update in backward;
- ``trainplan+cce@F``, ``trainplan+opt+cce@F``: those two with the loss head chunked (``loss_chunk=``, language
  models);
- ``trainplan+fused@F``, ``trainplan+opt+fused@F``: ``trainplan@F`` and ``trainplan+opt@F`` on the model whose
  forward groups run as Inductor-compiled ops (``trainplan.fuse.fused_ops``);
- ``sac@F``: the plan of ``trainplan@F`` exported as selective activation checkpointing of each block
  (``trainplan.loop.sac``), the model run eagerly under it;
- ``sac+compile@F``: the same export under ``torch.compile`` (its partitioner honours the policy's MUST_*).

The meter is the process's (``execute.measure.process_peak_during``: resident memory's high-water mark above
what the process held before the step, with freed memory returned to the system), the same for every method:
it counts the parameters' gradients, activations, temporaries, compiled code's buffers, the optimizer's
temporaries and everything else the step allocates; the parameters, the batch and the optimizer's state
(after the warm-up steps) are held before and not counted. Time is the step's wall time, median of
``--repeats`` steps timed after the metered ones with freed memory kept for reuse (docs/frontier.md), with its
spread (min-max) over all steps of all processes. Setup
(compiling, or tracing, profiling and solving a plan) is reported apart. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from host_load import MATMUL_N, matmul_gflops
from trainplan.frontier.plot import plot_frontier
from trainplan.frontier.run import FrontierSettings, run_method, summarize, verdicts

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
PLAN_TIME_LIMIT_S = 60.0


def methods(model: str) -> list[str]:
    lm = not model.startswith("resnet")
    hf = ["hf_checkpointing"] if lm else []  # transformers' ResNet has no checkpointing
    cce = ["trainplan+cce", "trainplan+opt+cce"] if lm else []  # the chunked loss head: language models only
    return (["eager", *hf, *(f"compile@{b}" for b in COMPILE_BUDGETS), *(f"compile+exact@{b}" for b in COMPILE_BUDGETS[1:]),
             *(f"{kind}@{f}" for kind in ("trainplan", "trainplan+opt", *cce, "sac", "sac+compile")
               for f in PLAN_FRACTIONS)])


def write(rows: list[dict[str, Any]], header: str, name: str) -> None:
    import pandas as pd

    frame = pd.DataFrame(rows)
    frame.to_csv(OUT / f"{name}.csv", index=False)
    plot_frontier(rows, str(OUT / f"{name}.png"),
                  "Memory/time frontier\none meter (process high-water mark), a fresh process per method")
    cols = ["model", "method", "peak_mib", "peak_min_mib", "peak_max_mib", "backward_peak_mib", "step_s", "step_min_s",
            "step_max_s", "setup_s", "processes", "planned_budget_bytes", "over_budget_mib", "plan_status", "error"]
    table = frame[[c for c in cols if c in frame]].to_markdown(index=False, floatfmt=".3f")
    verdict = "\n".join(f"- {v['model']} {v['method']} ({v['peak_mib']:.1f} MiB, {v['step_s']:.3f} s): "
                         + (f"dominated by {v['dominated_by']}" if v["dominated_by"] else "NOT dominated")
                         for v in verdicts(rows))
    (OUT / f"{name}.md").write_text(
        f"# trainplan against PyTorch's memory tools\n\n{header}\n\n{table}\n\n## Frontier\n\n{verdict}\n\n"
        f"![frontier]({name}.png)\n\n*Each point: one method's median step time against its median measured "
        "peak above the parameters, batch and optimizer state; bars: the min-max step time over every measured "
        "step.*\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2"], choices=sorted(MODELS))
    parser.add_argument("--repeats", type=int, default=5, help="measured steps per process")
    parser.add_argument("--processes", type=int, default=1, help="fresh processes per method")
    parser.add_argument("--methods", nargs="*", help="a subset of the methods (default: all)")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/trainplan-bench-plans"))
    parser.add_argument("--name", default="vs_pytorch", help="file stem of the tables and figure in bench/results/")
    args = parser.parse_args()
    settings = FrontierSettings(repeats=args.repeats, processes=args.processes, time_limit_s=PLAN_TIME_LIMIT_S)
    gflops = matmul_gflops(settings.threads)  # the host's speed before the run
    rows = []
    for model in args.models:
        for method in args.methods or methods(model):
            rows.append(summarize(run_method(model, MODELS[model], method, settings, args.cache)))
            print(json.dumps(rows[-1]), flush=True)
    import torch

    header = (f"torch {torch.__version__}, {os.cpu_count()} CPUs, {settings.threads} threads (the host before the run: "
              f"{gflops:.0f} GFLOP/s on a {MATMUL_N} x {MATMUL_N} fp32 matmul); AdamW; "
              f"{args.repeats} steps x {args.processes} process(es) per method after {settings.warmup} warm-ups; "
              f"`python bench/bench_vs_pytorch.py --models {' '.join(args.models)} --repeats {args.repeats} "
              f"--processes {args.processes}{' --methods ' + ' '.join(args.methods) if args.methods else ''}`, run alone "
              "on the machine")
    write(rows, header, args.name)


if __name__ == "__main__":
    main()
