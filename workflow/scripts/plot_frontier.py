"""Snakemake adapter: the frontier figure of one model (median step time against median measured peak)."""

from trainplan.frontier.plot import plot_frontier
from trainplan.io import read_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]):
    rows = read_table(snakemake.input.table).to_dict("records")
    wc, settings = snakemake.wildcards, snakemake.params.settings
    plot_frontier(rows, snakemake.output[0],
                  f"{wc.model} on {wc.device}: memory/time frontier, AdamW step, one process meter, "
                  f"{settings['repeats']} steps x {settings['processes']} fresh process(es) per method")
