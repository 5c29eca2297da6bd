"""Snakemake adapter: plot the memory timeline of one model's exported step."""

from trainplan.io import read_json, read_table
from trainplan.logs import log_to
from trainplan.plots import plot_memory

with log_to(snakemake.log[0]):
    plot_memory(read_table(snakemake.input.memory), read_json(snakemake.input.summary), snakemake.output[0])
