"""Benchmark: fp16 alignment padding (seed 001), ours per op class vs naive every-dimension padding.

Part 1, layer-shape sweep: conv/BN/ReLU/pool activations (odd and even n, c, h, w), fc widths,
vocabulary-sized logits and softmaxes, attention heads, at granularities g = 4, 16, 32 bytes: bytes
added ours vs naive, and the time of the padding copies themselves on real fp16 tensors (median of
``--repeats`` after a warm-up; the table says whether the host was busy).
Part 2, the study's models: every half-precision op of each model's traced step (precision from
``results/overflow/{model}/final_policy.yaml`` when the overflow stage ran, else the starting policy),
read from the align rule's ``results/align/{model}/summary.json`` when it exists (else, or with
``--retrace``, traced and planned at each g here); checks the targets: every tensor aligned after planning, ours strictly fewer bytes
than naive in total and never more per op, and at g = 4 at most 0.1% of the fp16 bytes.
Writes ``bench/results/align.md`` and ``bench/results/align.csv``.

    python bench/bench_align.py --repeats 5 --models gpt2 resnet50 t5_ff
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import pandas as pd
import torch
import yaml

from host_load import load_label
from trainplan.align.classes import OpSpec, build_problem
from trainplan.align.cost import padding_times
from trainplan.align.plan import plan_op
from trainplan.align.problem import solve
from trainplan.align.study import plan_model
from trainplan.align.units import quantum
from trainplan.export.trace import trace_training_step
from trainplan.models import build_model
from trainplan.precision.assign import assign_precision
from trainplan.precision.policy import load_policy

OUT = Path("bench/results")
GRANULARITIES = (4, 16, 32)


def sweep() -> list[OpSpec]:
    """Layer shapes: activations of CNN layers, fc layers, vocabulary logits, attention heads."""
    ops: list[OpSpec] = []
    for n in (1, 2, 3, 8):
        for c, hw in ((3, 224), (64, 112), (65, 56), (256, 56), (512, 28), (1024, 14), (2048, 7), (255, 15)):
            x = (n, c, hw, hw)
            tag = f"n{n}_c{c}_hw{hw}"
            ops += [
                OpSpec(f"relu_{tag}", "aten.relu.default", "float16", {"self": x}, {"out0": x}),
                OpSpec(f"bn_{tag}", "aten.native_batch_norm.default", "float16", {"input": x, "weight": (c,), "bias": (c,)},
                       {"out0": x, "out1": (c,), "out2": (c,)}, {"training": True}),
                OpSpec(f"bn_eval_{tag}", "aten._native_batch_norm_legit_no_training.default", "float16", {"input": x}, {"out0": x}),
                OpSpec(f"maxpool_{tag}", "aten.max_pool2d_with_indices.default", "float16", {"self": x},
                       {"out0": (n, c, (hw + 1) // 2, (hw + 1) // 2)}, {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1]}),
                OpSpec(f"conv_{tag}", "aten.convolution.default", "float16", {"input": x, "weight": (c, c, 3, 3)},
                       {"out0": x}, {"groups": 1}),
                OpSpec(f"mean_{tag}", "aten.mean.dim", "float16", {"self": x}, {"out0": (n, c, 1, 1)}, {"dim": [2, 3], "keepdim": True}),
            ]
    for tokens in (1, 127, 128, 255):
        for k, nout in ((768, 768), (768, 3072), (3072, 768), (1000, 1001), (768, 50257), (512, 32128)):
            ops.append(OpSpec(f"fc_t{tokens}_{k}x{nout}", "aten.addmm.default", "float16",
                              {"mat1": (tokens, k), "mat2": (k, nout), "self": (nout,)}, {"out0": (tokens, nout)}))
        for vocab in (50257, 50304, 32128, 30522, 32000):
            ops.append(OpSpec(f"softmax_t{tokens}_v{vocab}", "aten._softmax.default", "float16", {"self": (tokens, vocab)},
                              {"out0": (tokens, vocab)}, {"dim": -1}))
    for length in (127, 128, 1023):
        for heads, d in ((12, 64), (8, 80), (4, 9)):
            q = (1, heads, length, d)
            ops.append(OpSpec(f"sdpa_L{length}_h{heads}_d{d}", "aten._scaled_dot_product_flash_attention_for_cpu.default",
                              "float16", {"query": q, "key": q, "value": q}, {"out0": q}, {"is_causal": True}))
    return ops


def time_op(spec: OpSpec, g: int, repeats: int) -> tuple[float, float]:
    """Seconds of the padding copies (ours, naive) on random fp16 tensors of the op's shapes."""
    problem = build_problem(spec)
    q = quantum(g, 2)
    solution = solve(problem, q)
    gen = torch.Generator().manual_seed(0)
    bound = {t.role: torch.randn(t.shape, generator=gen).half() for t in problem.tensors}
    return padding_times(bound, problem, solution.padded, q, repeats, 1)


def sweep_table(repeats: int) -> pd.DataFrame:
    rows = []
    for spec in sweep():
        for g in GRANULARITIES:
            p = plan_op(spec, g)
            ours_s, naive_s = time_op(spec, g, repeats)
            rows.append({"op": spec.id, "class": p["class"], "granularity_bytes": g, "strategy": p["strategy"],
                         "bytes": p["bytes"], "pad_bytes": p["pad_bytes"], "naive_pad_bytes": p["naive_pad_bytes"],
                         "last_dim_pad_bytes": p["last_dim_pad_bytes"],
                         "aligned_after": all(t["aligned_after"] for t in p["tensors"]),
                         "pad_s_ours": ours_s, "pad_s_naive": naive_s})
    return pd.DataFrame(rows)


def _from_summary(path: Path) -> dict[str, object]:
    """A model row from the align rule's summary.json (same planner, same graph, same policy)."""
    s = json.loads(path.read_text())
    return {"model": s["model"], "policy": s["policy"], "granularity_bytes": s["granularity_bytes"], "ops": s["ops"],
            "tensors": s["tensors"], "tensor_bytes": s["tensor_bytes"], "pad_bytes": s["pad_bytes"],
            "naive_pad_bytes": s["naive_pad_bytes"], "last_dim_pad_bytes": s.get("last_dim_pad_bytes"),
            "aligned_before": s["tensors_aligned_before"], "aligned_after": s["tensors_aligned_after"],
            "ops_above_naive": 0 if s["never_more_than_naive_per_op"] else None, "naive_fallbacks": s["naive_fallbacks"]}


def model_table(models: list[str], config: str, retrace: bool) -> pd.DataFrame:
    """Per model and granularity; from ``results/align/{model}/summary.json`` (g of the rule) unless ``retrace``."""
    cfg = yaml.safe_load(Path(config).read_text())
    rows = []
    for name in models:
        summary = Path(f"results/align/{name}/summary.json")
        if summary.exists() and not retrace:
            rows.append(_from_summary(summary))
            continue
        final = Path(f"results/overflow/{name}/final_policy.yaml")
        policy_path = final if final.exists() else Path(cfg.get("overflow", {}).get("policy", "config/precision_policy.yaml"))
        traced, _ = trace_training_step(build_model(name, cfg["models"][name], seed=cfg.get("seed", 0)))
        dtypes = assign_precision(traced.gm, load_policy(policy_path), traced.loss_node).dtype
        for g in GRANULARITIES:
            plans, _ = plan_model(traced.gm, dtypes, g)
            tensors = [t for p in plans for t in p["tensors"]]
            total = sum(p["bytes"] for p in plans)
            rows.append({"model": name, "policy": str(policy_path), "granularity_bytes": g, "ops": len(plans),
                         "tensors": len(tensors), "tensor_bytes": total,
                         "pad_bytes": sum(p["pad_bytes"] for p in plans),
                         "naive_pad_bytes": sum(p["naive_pad_bytes"] for p in plans),
                         "last_dim_pad_bytes": sum(p["last_dim_pad_bytes"] for p in plans),
                         "aligned_before": sum(t["aligned_before"] for t in tensors),
                         "aligned_after": sum(t["aligned_after"] for t in tensors),
                         "ops_above_naive": sum(p["pad_bytes"] > p["naive_pad_bytes"] for p in plans),
                         "naive_fallbacks": sum(p["strategy"] == "naive" for p in plans)})
    frame = pd.DataFrame(rows)
    frame["pad_share"] = frame.pad_bytes / frame.tensor_bytes
    frame["naive_pad_share"] = frame.naive_pad_bytes / frame.tensor_bytes
    frame["last_dim_pad_share"] = frame.last_dim_pad_bytes.astype(float) / frame.tensor_bytes
    return frame


def markdown(frame: pd.DataFrame) -> str:
    """A Markdown table (numbers to 4 significant digits)."""
    def cell(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    head = "| " + " | ".join(frame.columns) + " |\n| " + " | ".join("---" for _ in frame.columns) + " |"
    return head + "".join("\n| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", nargs="*", default=["gpt2", "resnet50", "t5_ff"])
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--retrace", action="store_true", help="trace the models and plan every g instead of reading the align rule's summaries")
    args = ap.parse_args()
    torch.set_num_threads(2)
    start = time.time()
    loads = [os.getloadavg()[0]]
    shapes = sweep_table(args.repeats)
    loads.append(os.getloadavg()[0])
    models = model_table(args.models, args.config, args.retrace)
    OUT.mkdir(parents=True, exist_ok=True)
    shapes.to_csv(OUT / "align.csv", index=False)
    by_g = shapes.groupby("granularity_bytes").agg(
        ops=("op", "count"), bytes=("bytes", "sum"), pad_bytes=("pad_bytes", "sum"), naive_pad_bytes=("naive_pad_bytes", "sum"),
        last_dim_pad_bytes=("last_dim_pad_bytes", "sum"),
        aligned_after=("aligned_after", "all"), ops_above_naive=("pad_bytes", lambda s: int((s > shapes.loc[s.index, "naive_pad_bytes"]).sum())),
        pad_s_ours=("pad_s_ours", "sum"), pad_s_naive=("pad_s_naive", "sum")).reset_index()
    by_class = shapes.groupby(["granularity_bytes", "class"]).agg(
        ops=("op", "count"), pad_bytes=("pad_bytes", "sum"), naive_pad_bytes=("naive_pad_bytes", "sum"),
        pad_s_ours=("pad_s_ours", "sum"), pad_s_naive=("pad_s_naive", "sum")).reset_index()
    targets = []
    for _, r in models.iterrows():
        targets.append({"model": r.model, "g": r.granularity_bytes,
                        "every tensor aligned after": r.aligned_after == r.tensors,
                        "ours < naive in total": r.pad_bytes < r.naive_pad_bytes,
                        "never more per op": r.ops_above_naive == 0,
                        "<= 0.1% at g=4": (r.pad_share <= 0.001) if r.granularity_bytes == 4 else None})
    lines = [
        "# bench_align: fp16 alignment padding, ours (seed 001 per op class) vs naive (every dimension)",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.machine()} ({os.cpu_count()} cores, torch "
        f"{torch.__version__}, 2 threads), {time.time() - start:.0f} s. Times {load_label(loads)}; each is the median of "
        f"{args.repeats} runs after one warm-up of the padding copy alone (one allocation + copy + fill), summed over ops. "
        "No GPU here: the effect of aligned shapes on CUDA fp16 matmul speed was not measured.",
        "",
        "## Layer-shape sweep, totals per granularity",
        "", markdown(by_g), "",
        "## Layer-shape sweep, per class", "", markdown(by_class), "",
        "## Models of the study (every half-precision op of one traced training step)", "",
        markdown(models.drop(columns=["policy"])), "",
        "Policies: " + ", ".join(f"{m}: `{p}`" for m, p in dict(zip(models.model, models.policy)).items()), "",
        "## Targets", "", markdown(pd.DataFrame(targets)), "",
        "Per-op rows of the sweep: `bench/results/align.csv`.",
    ]
    (OUT / "align.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
