"""Snakemake adapter: predicted against measured step time of each partition method run as a pipeline."""

from trainplan.io import read_table
from trainplan.logs import log_to
from trainplan.pipeline.plot import plot_methods

with log_to(snakemake.log[0]):
    plot_methods(read_table(snakemake.input.table), snakemake.output[0])
