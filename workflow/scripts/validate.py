"""Snakemake adapter: execute one plan on the real model and compare it with its prediction.

A plan that fails validation is written with status "failed" (the workflow goes on); a corrupt plan
file stops the rule with a PlanError naming the file and the problem.
"""

import torch

from trainplan.artifacts import read_graph, read_host_link_sizes
from trainplan.execute import Tolerances, ValidateSettings, load_plan, validate_plan
from trainplan.io import write_json, write_table
from trainplan.logs import log_to
from trainplan.models import build_model

with log_to(snakemake.log[0]) as log:
    inp, par, wc = snakemake.input, snakemake.params, snakemake.wildcards
    graph = read_graph(inp.nodes, inp.tensors, inp.summary)
    plan, stages = load_plan(inp.plan)
    torch.set_num_threads(par.settings["threads"])
    built = build_model(wc.model, par.spec, seed=par.seed)
    settings = ValidateSettings(
        repeats=par.settings["repeats"],
        warmup=par.settings["warmup"],
        device=par.device["type"],
        tolerances=Tolerances(**par.settings["tolerances"]),
        allocator_check=par.settings["allocator_check"],
        attempts=par.settings["attempts"],
        host_memory=par.device.get("host_memory"),
    )
    result = validate_plan(built, plan, stages, graph.tensors, export_names=graph.nodes["name"].tolist(),
                           settings=settings, link_sizes=read_host_link_sizes(inp.profile_summary))
    report = result.report
    log.info("%s k=%s b=%s: %s", wc.model, wc.k, wc.budget, report["status"])
    for reason in report["reasons"]:
        log.warning("%s", reason)
    for note in report.get("unreliable", []):
        log.warning("unreliable: %s", note)
    write_json(snakemake.output.validation, report)
    write_table(snakemake.output.timeline, result.timeline)
