"""Snakemake adapter: final lists, denied ops, fp16 shares vs autocast and measured cost of one model's loop."""

import torch

from trainplan.io import read_json, read_table, write_json, write_table, write_yaml
from trainplan.logs import log_to
from trainplan.precision.cases import build_case
from trainplan.precision.policy import load_next_policy, load_policy
from trainplan.precision.summary import summarize

with log_to(snakemake.log[0]) as log:
    torch.set_num_threads(snakemake.threads)
    model, p = snakemake.wildcards.model, snakemake.params
    traced, flat, _ = build_case(model, p.spec, p.seed, p.param_scale)
    nodes = read_table(snakemake.input.nodes, ["name", "flops"])
    iterations = [read_json(f, schema="findings") for f in snakemake.input.iterations]
    final = load_next_policy(snakemake.input.final_policy, iterations[-1], snakemake.input.iterations[-1])
    result = summarize(traced, flat, iterations, load_policy(snakemake.input.policy), final,
                       dict(zip(nodes.name, nodes.flops)), injected=[e["node"] for e in p.inject],
                       repeats=p.repeats, warmup=p.warmup, emulate_matmul=p.emulate_matmul)
    s = result.summary
    s["max_iterations"] = p.max_iterations
    log.info("model %s: %d iterations, converged %s, denied %s, fp16 FLOP share final %.4f vs autocast %.4f",
             model, s["iterations"], s["converged"], s["denied_nodes"],
             s["shares"]["final"]["fp16_flop_share"], s["shares"]["autocast"]["fp16_flop_share"])
    write_table(snakemake.output.precision, result.precision)
    write_table(snakemake.output.findings, result.findings)
    write_yaml(snakemake.output.policy, final.to_dict())
    write_json(snakemake.output.summary, s)
