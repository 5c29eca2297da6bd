"""Snakemake adapter: compile one model's forward groups with Inductor and time them against the unfused ops."""

import torch

from trainplan.fuse.measure import measure_fusion
from trainplan.io import read_json, read_table, write_json, write_table
from trainplan.logs import log_to
from trainplan.models import build_model

with log_to(snakemake.log[0]) as log:
    inp, par = snakemake.input, snakemake.params
    settings = par.settings
    torch.set_num_threads(settings["threads"])
    built = build_model(snakemake.wildcards.model, par.spec, seed=par.seed)
    table, summary = measure_fusion(
        built, read_json(inp.groups), read_table(inp.table),
        min_ops=settings["min_ops"], max_groups=settings["max_groups"], repeats=settings["repeats"],
        warmup=settings["warmup"], whole_step=settings["whole_step"], rtol=settings["grad_rtol"],
        atol=settings["grad_atol"], log=log.info,
    )
    summary.update({"target": snakemake.wildcards.target, "device": snakemake.wildcards.device,
                    "measured_under": "the machine as the workflow ran it (other jobs may share it)"})
    write_json(snakemake.output.summary, summary)
    write_table(snakemake.output.groups, table)
