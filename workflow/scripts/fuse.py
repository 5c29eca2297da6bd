"""Snakemake adapter: fusion groups of one model's exported step for one target, with baselines."""

from trainplan.artifacts import read_graph
from trainplan.fuse.stage import fuse_exported
from trainplan.fuse.support import resolve_table
from trainplan.io import read_table, write_json, write_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]) as log:
    inp, par = snakemake.input, snakemake.params
    graph = read_graph(inp.nodes, inp.tensors, inp.summary)
    ops = read_table(inp.profile, ["name", "time_s"])
    table = resolve_table({"table": inp.table[0]} if inp.table else dict(par.target))
    result = fuse_exported(graph.nodes, graph.tensors, ops, table, par.fx_max_nodes)
    stats = result.fusion.stats
    log.info("%s/%s: %d groups (%d of >= 2 ops), %d host nodes, %d rejected by the library, %.3f s",
             snakemake.wildcards.model, table.name, stats["groups"], stats["groups_ge2"],
             stats["n_nodes"] - stats["n_eligible"], stats["n_rejected"], stats["time_s"])
    log.info("\n%s", result.compare.to_string())
    write_json(snakemake.output.groups, {"model": snakemake.wildcards.model, "device": snakemake.wildcards.device,
                                         **result.document})
    write_table(snakemake.output.table, result.groups)
    write_table(snakemake.output.compare, result.compare)
