"""Snakemake adapter: plans on the fused models next to the raw models' plans, as a table and a figure."""

from trainplan.fuse.plan_compare import compare_table, plan_row
from trainplan.fuse.plot import plot_plan_compare
from trainplan.io import read_json, write_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]) as log:
    inp = snakemake.input
    rows = []
    for i, case in enumerate(snakemake.params.cases):
        rows.append(plan_row(model=case["model"], graph=case["graph"], graph_summary=read_json(inp.graphs[i]),
                             partition=read_json(inp.partitions[i]), schedules=read_json(inp.schedules[i]),
                             plan=read_json(inp.plans[i]), validation=read_json(inp.validations[i])))
    table = compare_table(rows)
    log.info("\n%s", table.to_string())
    write_table(snakemake.output.table, table)
    plot_plan_compare(table, snakemake.output.plot)
