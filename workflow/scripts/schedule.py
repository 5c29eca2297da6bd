"""Snakemake adapter: write each stage's scheduling problem and solve it with our MIP and every baseline."""

from pathlib import Path

from trainplan.artifacts import read_host_link, read_profiled_graph
from trainplan.io import read_json, write_json, write_table
from trainplan.logs import log_to
from trainplan.stage_schedule import SolverSettings, comparison_table, schedule_stages

with log_to(snakemake.log[0]) as log:
    inp, out, par, wc = snakemake.input, snakemake.output, snakemake.params, snakemake.wildcards
    graph = read_profiled_graph(inp.nodes, inp.tensors, inp.summary, inp.profile)
    partition = read_json(inp.partition, schema="partition")
    stages = [stage["nodes"] for stage in partition["stages"]]
    results = schedule_stages(graph.nodes, graph.tensors, stages, fraction=float(wc.budget), bandwidth=read_host_link(inp.profile_summary),
                              solver=SolverSettings(par.time_limit_s, par.workers, par.seed))
    for res in results:
        write_json(Path(out.problems) / f"stage{res.index}.json", res.problem)
        write_json(Path(out.schedules) / f"stage{res.index}.json", {**res.ours.to_dict(), "stage_nodes": res.nodes})
        write_json(Path(out.schedules) / f"stage{res.index}.methods.json", res.methods)
        log.info("stage %d: %s, time %s s, peak %s B of budget %s B", res.index, res.ours.status,
                 res.ours.time, res.ours.peak_bytes, res.ours.budget_bytes)
    write_table(out.table, comparison_table(wc.model, int(wc.k), float(wc.budget), results))
