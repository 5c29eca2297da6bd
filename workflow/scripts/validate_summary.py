"""Snakemake adapter: one row per validated stage of every plan, failed plans and their reasons included; raised
budgets and each device's memory model logged."""

import pandas as pd

from trainplan.execute import summary_rows
from trainplan.io import read_json, write_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]) as log:
    rows = [row for path in snakemake.input for row in summary_rows(read_json(path, schema="validation"))]
    table = pd.DataFrame(rows)
    plans = table[["model", "k", "budget", "status"]].drop_duplicates()
    log.info("%d plan(s) validated: %s", len(snakemake.input), plans.status.value_counts().to_dict())
    for row in plans[plans.status != "passed"].itertuples():
        log.warning("%s: %s k=%s budget %s", row.status.upper(), row.model, row.k, row.budget)
    for row in table[table.schedule_status == "raised"].itertuples():
        log.warning("RAISED: %s k=%s budget %s stage %s: requested %s B, planned at %s B (requested budget: %s)",
                    row.model, row.k, row.budget, row.stage, row.requested_budget_bytes, row.budget_bytes,
                    row.budget_status)
    for device, model in snakemake.params.memory_models.items():
        log.info("device %s: host memory %s: %s", device, model["host_memory"], model["note"])
    write_table(snakemake.output.table, table)
