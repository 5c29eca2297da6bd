"""Snakemake adapter: one model's overflow passes (bad ops, roots) and its final precision lists."""

from trainplan.io import read_json, read_table
from trainplan.logs import log_to
from trainplan.precision.report import plot_model_overflow

with log_to(snakemake.log[0]):
    plot_model_overflow(read_json(snakemake.input.summary), read_table(snakemake.input.findings),
                        read_table(snakemake.input.precision), snakemake.output[0])
