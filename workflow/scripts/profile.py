"""Snakemake adapter: measure every op of one model's training step on the configured device."""

import torch

from trainplan.artifacts import read_graph
from trainplan.io import write_json, write_table
from trainplan.logs import log_to
from trainplan.models import build_model
from trainplan.profile.op_times import profile_model

with log_to(snakemake.log[0]) as log:
    graph = read_graph(snakemake.input.nodes, snakemake.input.tensors, snakemake.input.summary)
    torch.set_num_threads(snakemake.params.torch_threads)
    built = build_model(snakemake.wildcards.model, snakemake.params.spec, seed=snakemake.params.seed)
    result = profile_model(
        built,
        graph.nodes,
        device=snakemake.params.device,
        repeats=snakemake.params.repeats,
        warmup=snakemake.params.warmup,
    )
    log.info("step %.4f s, per-op sum %.4f s, ratio %.3f",
             result.summary["step_time_s"], result.summary["op_sum_s"], result.summary["op_sum_over_step"])
    write_table(snakemake.output.ops, result.ops)
    write_json(snakemake.output.summary, result.summary)
