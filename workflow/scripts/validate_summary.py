"""Snakemake adapter: one row per validated stage of every plan, failed plans and their reasons included."""

import pandas as pd

from trainplan.execute import summary_rows
from trainplan.io import read_json, write_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]) as log:
    rows = [row for path in snakemake.input for row in summary_rows(read_json(path, schema="validation"))]
    table = pd.DataFrame(rows)
    plans = table[["model", "k", "budget_fraction", "status"]].drop_duplicates()
    log.info("%d plan(s) validated: %s", len(snakemake.input), plans.status.value_counts().to_dict())
    for row in plans[plans.status != "passed"].itertuples():
        log.warning("%s: %s k=%s budget %s", row.status.upper(), row.model, row.k, row.budget_fraction)
    write_table(snakemake.output.table, table)
