"""Snakemake adapter: one model's memory/time frontier, trainplan against PyTorch's tools (trainplan.frontier)."""

import pandas as pd

from trainplan.frontier.run import FrontierSettings, run_frontier, verdicts
from trainplan.io import write_json, write_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]) as log:
    par, wc = snakemake.params, snakemake.wildcards
    if par.device["type"] != "cpu":
        raise ValueError(f"frontier of model '{wc.model}' on device '{wc.device}': the process meter is the CPU's; "
                         "CUDA frontiers are not built yet (study.frontier runs on cpu devices)")
    keys = ("repeats", "warmup", "processes", "threads", "time_limit_s")
    settings = FrontierSettings(**{k: par.settings[k] for k in keys}, seed=par.seed)
    rows = run_frontier(wc.model, par.spec, par.settings["methods"], settings, log)
    write_table(snakemake.output.table, pd.DataFrame(rows))
    write_json(snakemake.output.verdicts, {"model": wc.model, "device": wc.device, "settings": par.settings,
                                           "verdicts": verdicts(rows)})
