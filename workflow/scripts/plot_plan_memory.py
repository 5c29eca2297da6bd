"""Snakemake adapter: device bytes of each stage before (no recompute) and after the chosen plan."""

from trainplan.execute import load_plan
from trainplan.execute.plot import plot_plan_memory
from trainplan.io import read_json, read_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]):
    _, stages = load_plan(snakemake.input.plan)
    plot_plan_memory(read_json(snakemake.input.validation, schema="validation"), read_table(snakemake.input.timeline), stages,
                     snakemake.output[0])
