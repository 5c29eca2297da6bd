"""Snakemake adapter: the fused graph of one model and target as export and profile tables (groups as ops)."""

from trainplan.artifacts import read_graph, write_graph
from trainplan.fuse.coarsen import coarsen
from trainplan.fuse.phases import phase_groups
from trainplan.fuse.support import resolve_table
from trainplan.io import read_json, read_table, write_json, write_table
from trainplan.logs import log_to

with log_to(snakemake.log[0]) as log:
    inp, out, wc, par = snakemake.input, snakemake.output, snakemake.wildcards, snakemake.params
    graph = read_graph(inp.nodes, inp.tensors, inp.summary)
    ops = read_table(inp.profile, ["name", "time_s"])
    if par.scope == "phases":
        table = resolve_table({"table": inp.table[0]} if inp.table else dict(par.target))
        grouping = phase_groups(graph.nodes, graph.tensors, table)
        groups, measured, source = grouping["groups"], None, {"scope": "phases", "phases": grouping["stats"]}
        for phase, s in grouping["stats"].items():
            if isinstance(s, dict):
                log.info("%s ops: %d computing, %d groups of >= 2 (largest %d, %d members, %d saved views joined)",
                         phase, s["computing_ops"], s["groups_ge2"], s["largest"], s["members"], s["saved_views"])
    else:
        groups = read_json(inp.groups)["groups"]
        measured = read_table(inp.measure, ["group", "unfused_s", "fused_s"]) if "measure" in inp.keys() else None
        source = {"scope": "step", "groups_file": str(inp.groups)}
    coarse = coarsen(graph.nodes, graph.tensors, ops, groups, measured)
    stats = {"target": wc.target, **source, **coarse.stats}
    log.info("%s+%s: %d ops -> %d (%d groups of %d ops contracted, %d internal storages, %d timed fused)",
             wc.model, wc.target, stats["ops_raw"], stats["ops_coarse"], stats["groups_contracted"],
             stats["members"], stats["internal_storages"], stats["groups_timed_fused"])
    write_graph(out.nodes, out.tensors, out.summary, coarse.nodes, coarse.tensors,
                {**graph.summary, "fused": stats, "groups": groups})
    write_table(out.profile, coarse.ops)
    write_json(out.profile_summary, {**read_json(inp.profile_summary), "fused": stats})
