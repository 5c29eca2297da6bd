"""Snakemake adapter: study table (CSV) and figure of the alignment padding over all models."""

from trainplan.align.report import plot_study, study_table
from trainplan.io import read_json, write_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]):
    table = study_table([read_json(f) for f in snakemake.input.summaries], [read_json(f) for f in snakemake.input.steps])
    write_table(snakemake.output.table, table)
    plot_study(table, snakemake.output.plot)
