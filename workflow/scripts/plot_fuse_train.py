"""Snakemake adapter: the fused training step figure of one model and target."""

from trainplan.fuse.plot import plot_train_step
from trainplan.io import read_json, read_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]):
    inp, w = snakemake.input, snakemake.wildcards
    plot_train_step(read_table(inp.groups), read_json(inp.summary), f"{w.model} on {w.target}: training step with fused ops",
                    snakemake.output[0])
