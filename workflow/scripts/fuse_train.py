"""Snakemake adapter: the training step with fused ops (forward graph partitioned, groups compiled with
autograd) timed against eager and Inductor on the whole forward."""

import torch

from trainplan.fuse.support import resolve_table
from trainplan.fuse.train_step import measure_train_step
from trainplan.io import write_json, write_table
from trainplan.logs import log_to
from trainplan.models import build_model, on_device

with log_to(snakemake.log[0]) as log:
    inp, par, w = snakemake.input, snakemake.params, snakemake.wildcards
    settings = par.settings
    torch.set_num_threads(settings["threads"])
    table = resolve_table({"table": inp.table[0]} if inp.table else dict(par.target))
    built = on_device(build_model(w.model, par.spec, seed=par.seed), par.device_type)
    groups, summary = measure_train_step(
        built, table, min_ops=settings["min_ops"], max_groups=settings["max_groups"], rounds=settings["rounds"],
        warmup=settings["warmup"], whole_step=settings["whole_step"], rtol=settings["grad_rtol"],
        atol=settings["grad_atol"], seed=par.seed, log=log.info,
    )
    summary.update({"target": w.target, "device": w.device,
                    "measured_under": "the machine as the workflow ran it (the rule takes every core it was given)"})
    write_json(snakemake.output.summary, summary)
    write_table(snakemake.output.groups, groups)
