"""Snakemake adapter: build each stage's scheduling problem and solve it with our method and every baseline;
write every stage (problem, schedules) to one schedules.json and the comparison table. Ops may be swapped only
where the device's host memory is separate (its memory model, recorded in schedules.json). With k >= 2 stages the
budget is each rank's in a pipeline of the balance block's micro-batches and schedule
(trainplan.schedule.pipeline_hold)."""

from trainplan.artifacts import read_host_link, read_profiled_graph
from trainplan.budget import wildcard_budget
from trainplan.io import read_json, write_json, write_table
from trainplan.logs import log_to
from trainplan.schedule.budgeted_stages import (SolverSettings, StageBudget, comparison_table, schedule_stages,
                                                stage_schedules_dict)
from trainplan.schedule.pipeline_hold import PipelineHold

with log_to(snakemake.log[0]) as log:
    inp, out, par, wc = snakemake.input, snakemake.output, snakemake.params, snakemake.wildcards
    graph = read_profiled_graph(inp.nodes, inp.tensors, inp.summary, inp.profile)
    partition = read_json(inp.partition, schema="partition")
    stages = [stage["nodes"] for stage in partition["stages"]]
    requested = wildcard_budget(wc.budget)
    budget = StageBudget(requested, read_host_link(inp.profile_summary), par.memory_model["swaps"],
                         PipelineHold(int(wc.k), par.micro_batches, par.pipeline_schedule),
                         par.memory_model["device_type"])
    results = schedule_stages(graph.nodes, graph.tensors, stages, budget=budget,
                              solver=SolverSettings(par.time_limit_s, par.workers, par.seed))
    for res in results:
        log.info("stage %d: %s, time %s s, peak %s B of budget %s B; baselines: %s", res.index, res.ours.status,
                 res.ours.time, res.ours.peak_bytes, res.ours.budget_bytes,
                 ", ".join(f"{m} {d['status']}" for m, d in res.methods.items() if m != "ours"))
    head = {"model": wc.model, "device": wc.device, "k": int(wc.k), **requested.fields(),
            "memory_model": dict(par.memory_model)}
    write_json(out.schedules, stage_schedules_dict(head, results))
    write_table(out.table, comparison_table(wc.model, int(wc.k), requested, results))
