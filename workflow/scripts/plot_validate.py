"""Snakemake adapter: predicted vs measured device bytes, event by event, with the stage table."""

from trainplan.execute.plot import plot_validation
from trainplan.io import read_json, read_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]):
    plot_validation(read_json(snakemake.input.validation, schema="validation"), read_table(snakemake.input.timeline), snakemake.output[0])
