"""Snakemake adapter: the fused graph of one model and target as export and profile tables (groups as ops)."""

from trainplan.artifacts import read_graph, write_graph
from trainplan.fuse.coarsen import coarsen
from trainplan.io import read_json, read_table, write_json, write_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]) as log:
    inp, out, wc = snakemake.input, snakemake.output, snakemake.wildcards
    graph = read_graph(inp.nodes, inp.tensors, inp.summary)
    ops = read_table(inp.profile, ["name", "time_s"])
    groups = read_json(inp.groups)["groups"]
    measured = read_table(inp.measure[0], ["group", "unfused_s", "fused_s"]) if inp.measure else None
    coarse = coarsen(graph.nodes, graph.tensors, ops, groups, measured)
    stats = {"target": wc.target, "groups_file": str(inp.groups), **coarse.stats}
    log.info("%s+%s: %d ops -> %d (%d groups of %d ops contracted, %d internal storages, %d timed fused)",
             wc.model, wc.target, stats["ops_raw"], stats["ops_coarse"], stats["groups_contracted"],
             stats["members"], stats["internal_storages"], stats["groups_timed_fused"])
    write_graph(out.nodes, out.tensors, out.summary, coarse.nodes, coarse.tensors, {**graph.summary, "fused": stats})
    write_table(out.profile, coarse.ops)
    write_json(out.profile_summary, {**read_json(inp.profile_summary), "fused": stats})
