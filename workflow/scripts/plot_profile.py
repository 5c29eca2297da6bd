"""Snakemake adapter: plot per-op times of one model."""

from trainplan.io import read_json, read_table
from trainplan.logs import log_to
from trainplan.plots import plot_op_times

with log_to(snakemake.log[0]):
    ops = read_table(snakemake.input.ops).merge(read_table(snakemake.input.nodes)[["name", "op"]], on="name")
    plot_op_times(ops, read_json(snakemake.input.summary), snakemake.output[0])
