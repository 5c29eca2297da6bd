"""Snakemake adapter: plot the per-stage scheduled times of every balance iteration and of the DP."""

from trainplan.io import read_json
from trainplan.logs import log_to
from trainplan.partition.plot import plot_balance

with log_to(snakemake.log[0]):
    plot_balance(read_json(snakemake.input.iterations, schema="iterations"), snakemake.output[0])
