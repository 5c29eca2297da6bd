"""Snakemake adapter: per conv and fast-memory size, the I/O lower bound, the paper's tile and dataflow I/O,
and the simulated dataflow's reads and writes where the conv is small enough."""

from trainplan.io import read_table, write_table
from trainplan.layout.iobound import io_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]) as log:
    io = snakemake.params.io
    table = io_table(read_table(snakemake.input.convs), io["fast_memory"], io["cores"], io["simulate_steps"])
    table.insert(0, "model", snakemake.wildcards.model)
    log.info("%d rows, %d simulated", len(table), int(table.get("simulated_io", table.S * 0).notna().sum()))
    write_table(snakemake.output.io, table)
