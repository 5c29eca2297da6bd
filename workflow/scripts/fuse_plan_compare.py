"""Snakemake adapter: plans on the fused graphs next to the raw graph's, as a table and a figure."""

from trainplan.fuse.plan_compare import compare_table, plan_row
from trainplan.fuse.plot import plot_plan_compare
from trainplan.io import read_json, read_table, write_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]) as log:
    inp = snakemake.input
    rows = []
    for i, case in enumerate(snakemake.params.cases):
        coarse = read_table(inp.coarse_ops[case["coarse"]]) if case["coarse"] is not None else None
        rows.append(plan_row(model=case["model"], graph=case["graph"], partition=read_json(inp.partitions[i]),
                             schedules=read_json(inp.schedules[i]), plan=read_json(inp.plans[i]),
                             validation=read_json(inp.validations[i]), coarse_ops=coarse))
    table = compare_table(rows)
    log.info("\n%s", table.to_string())
    write_table(snakemake.output.table, table)
    plot_plan_compare(table, snakemake.output.plot)
