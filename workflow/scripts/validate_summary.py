"""Snakemake adapter: one row per validated stage of every plan, failed plans and their reasons included."""

import pandas as pd

from trainplan.execute import summary_rows
from trainplan.io import read_json, write_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]) as log:
    rows = [row for path in snakemake.input for row in summary_rows(read_json(path))]
    table = pd.DataFrame(rows)
    failed = table.loc[table.status == "failed", ["model", "k", "budget_fraction"]].drop_duplicates()
    log.info("%d plan(s) validated, %d failed", len(snakemake.input), len(failed))
    for row in failed.itertuples():
        log.warning("FAILED: %s k=%s budget %s", row.model, row.k, row.budget_fraction)
    write_table(snakemake.output.table, table)
