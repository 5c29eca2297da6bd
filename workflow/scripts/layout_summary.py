"""Snakemake adapter: one row per CNN of the layout study, and the study figure."""

import pandas as pd

from trainplan.io import read_json, read_table, write_table
from trainplan.layout.plot import plot_summary
from trainplan.layout.summary import summary_row
from trainplan.logs import log_to

with log_to(snakemake.log[0]) as log:
    plans = [read_json(p) for p in snakemake.input.plans]
    executions = [read_json(p) for p in snakemake.input.executions]
    summary = pd.DataFrame([summary_row(p, e) for p, e in zip(plans, executions)])
    preds = pd.concat([read_table(p) for p in snakemake.input.predictions], ignore_index=True)
    io = pd.concat([read_table(p) for p in snakemake.input.io], ignore_index=True)
    log.info("%d model(s); exact plan slower than the fastest single layout beyond noise on %d, faster on %d; "
             "adopted plan slower beyond noise on %d", len(summary), int(summary.slower_than_best_single.sum()),
             int(summary.faster_than_best_single.sum()), int(summary.adopted_slower_than_best_single.sum()))
    write_table(snakemake.output.table, summary)
    plot_summary(summary, preds, io, snakemake.output.figure)
