"""Snakemake adapter: gather one model's schedule comparisons over all budgets into a table and a plot."""

import pandas as pd

from trainplan.io import read_table, write_table
from trainplan.logs import log_to
from trainplan.plots import plot_schedule_comparison

with log_to(snakemake.log[0]):
    table = pd.concat([read_table(path) for path in snakemake.input.tables], ignore_index=True)
    write_table(snakemake.output.table, table)
    plot_schedule_comparison(table, snakemake.output.plot)
