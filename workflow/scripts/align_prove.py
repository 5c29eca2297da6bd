"""Snakemake adapter: padded training steps of one model (every half-precision op padded as planned) vs unpadded."""

import pandas as pd
import torch

from trainplan.align.execute import ATOL, RTOL
from trainplan.align.study import prove_model
from trainplan.export.trace import trace_training_step
from trainplan.io import write_json, write_table
from trainplan.logs import log_to
from trainplan.models import build_model
from trainplan.precision.assign import assign_precision, fp32_dtypes
from trainplan.precision.interpreter import run_step
from trainplan.precision.policy import load_policy

with log_to(snakemake.log[0]) as log:
    torch.set_num_threads(snakemake.threads)
    model, p = snakemake.wildcards.model, snakemake.params
    policy = load_policy(snakemake.input.policy)
    runs = [("model", p.spec)]
    if p.prove_inputs:
        runs.append(("odd", {**p.spec, "inputs": {**p.spec.get("inputs", {}), **p.prove_inputs}}))
    tables, steps = [], []
    for label, spec in runs:
        traced, flat = trace_training_step(build_model(model, spec, seed=p.seed))
        dtypes = assign_precision(traced.gm, policy, traced.loss_node).dtype
        fp32 = run_step(traced.gm, flat, fp32_dtypes(traced.gm))
        for g in p.granularities:
            timing = (p.repeats, p.warmup) if (label == "model" and g == p.granularity) else None
            rows, step = prove_model(traced.gm, flat, dtypes, g, label, timing=timing, fp32_ref=fp32, matmul_rule=p.matmul_rule)
            log.info("%s %s g=%d: %d distinct ops, %d padded, %d identical, %d within tolerance; loss diff %.3g "
                     "(fp16 vs fp32 %.3g), grad rel diff %.3g", model, label, g, step["distinct_ops"],
                     step["distinct_ops_padded"], step["distinct_ops_identical"], step["distinct_ops_within_tolerance"],
                     step["loss_abs_diff"], step["fp16_vs_fp32_loss_abs_diff"], step["gradient_max_rel_diff"])
            tables.append(rows)
            steps.append({**step, "inputs": spec.get("inputs", {})})
    write_table(snakemake.output.proof, pd.concat(tables, ignore_index=True))
    write_json(snakemake.output.steps, {"model": model, "tolerance": {"rtol": RTOL, "atol_of_max": ATOL},
                                        "timing": {"repeats": p.repeats, "warmup": p.warmup, "threads": snakemake.threads,
                                                   "under_load": True},
                                        "steps": steps})
