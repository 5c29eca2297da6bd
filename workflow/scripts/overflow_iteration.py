"""Snakemake adapter: one S1-S3 pass of the overflow loop for one model."""

import torch

from trainplan.io import read_json, write_json, write_yaml
from trainplan.logs import log_to
from trainplan.precision.cases import build_case
from trainplan.precision.interpreter import parse_injections
from trainplan.precision.iterate import run_iteration
from trainplan.precision.policy import load_next_policy, load_policy

with log_to(snakemake.log[0]) as log:
    torch.set_num_threads(snakemake.threads)
    model, p = snakemake.wildcards.model, snakemake.params
    traced, flat, scaled = build_case(model, p.spec, p.seed, p.param_scale)
    injections = parse_injections(p.inject, traced.gm, model)
    if "previous" in snakemake.input.keys():
        findings = read_json(snakemake.input.previous, schema="findings")
        policy = load_next_policy(snakemake.input.policy, findings, snakemake.input.previous)
        previous = findings["inherent"]
    else:
        policy, previous = load_policy(snakemake.input.policy), None
    result = run_iteration(traced, flat, policy, p.iteration, injections,
                           saturating=p.saturate, emulate_matmul=p.emulate_matmul, inherent=previous)
    log.info("model %s iteration %d: %d ops recorded, roots %s, loss %.4f",
             model, p.iteration, len(result.findings), result.roots, result.loss)
    write_yaml(snakemake.output.policy, result.next_policy.to_dict())
    write_json(snakemake.output.findings, {"model": model, "scaled_parameters": scaled,
                                           "injections": list(p.inject), **result.to_dict()})
