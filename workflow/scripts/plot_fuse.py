"""Snakemake adapter: the fusion figure of one model and target."""

from trainplan.fuse.plot import plot_fusion
from trainplan.io import read_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]):
    inp, w = snakemake.input, snakemake.wildcards
    measure = read_table(inp.measure) if inp.get("measure") else None
    plot_fusion(read_table(inp.groups), read_table(inp.compare), measure, f"{w.model} (forward graph) on {w.target}",
                snakemake.output[0])
