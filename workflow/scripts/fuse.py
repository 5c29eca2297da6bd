"""Snakemake adapter: fusion groups of one model's forward graph for one target, with baselines."""

from trainplan.artifacts import read_graph
from trainplan.fuse.forward import trace_forward
from trainplan.fuse.stage import fuse_forward
from trainplan.fuse.support import resolve_table
from trainplan.io import read_table, write_json, write_table
from trainplan.logs import log_to
from trainplan.models import build_model, on_device

with log_to(snakemake.log[0]) as log:
    inp, par, w = snakemake.input, snakemake.params, snakemake.wildcards
    graph = read_graph(inp.nodes, inp.tensors, inp.summary)
    ops = read_table(inp.profile, ["name", "time_s"])
    table = resolve_table({"table": inp.table[0]} if inp.table else dict(par.target))
    fg = trace_forward(on_device(build_model(w.model, par.spec, seed=par.seed), par.device_type))
    result = fuse_forward(fg, table, graph.nodes, ops, par.fx_max_nodes)
    stats = result.fusion.stats
    log.info("%s/%s: forward graph of %d ops (%d named as in the exported step): %d groups (%d of >= 2 ops), "
             "%d host nodes, %d rejected by the library, %.3f s", w.model, table.name,
             result.document["graph"]["ops"], result.document["graph"]["ops_in_exported_step"], stats["groups"],
             stats["groups_ge2"], stats["n_nodes"] - stats["n_eligible"], stats["n_rejected"], stats["time_s"])
    log.info("\n%s", result.compare.to_string())
    write_json(snakemake.output.groups, {"model": w.model, "device": w.device, **result.document})
    write_table(snakemake.output.table, result.groups)
    write_table(snakemake.output.compare, result.compare)
