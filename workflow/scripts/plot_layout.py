"""Snakemake adapter: the per-model layout figure."""

from trainplan.io import read_json, read_table
from trainplan.layout.plot import plot_model
from trainplan.logs import log_to

with log_to(snakemake.log[0]):
    plot_model(read_table(snakemake.input.predictions), read_json(snakemake.input.execution), snakemake.output[0])
