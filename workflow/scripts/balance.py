"""Snakemake adapter: schedule each stage at the budget, re-partition for balance, compare with the DP.

Iteration 0 (the partition rule's stages) takes its schedules from the schedule rule's schedules.json, checked
against the partition and replayed; later iterations solve their new stages with the same function, swapping
only where the device's host memory is separate (its memory model, recorded in plan.json).
"""

from trainplan.artifacts import read_host_link, read_profiled_graph
from trainplan.budget import wildcard_budget
from trainplan.io import read_json, write_json
from trainplan.logs import log_to
from trainplan.partition import (
    BalanceSettings,
    MemoryLimit,
    SolverSettings,
    StageScheduler,
    balance,
    iterations_dict,
    partition_from_dict,
    pipeline_graph,
    plan_dict,
    range_tables,
)
from trainplan.schedule.budgeted_stages import read_stage_schedules
from trainplan.schedule.pipeline_hold import PipelineHold

with log_to(snakemake.log[0]) as log:
    inp, par, wc = snakemake.input, snakemake.params, snakemake.wildcards
    graph = read_profiled_graph(inp.nodes, inp.tensors, inp.summary, inp.profile)
    pipeline = pipeline_graph(graph.nodes, graph.tensors)
    tables = range_tables(pipeline)
    settings = BalanceSettings(**par.balance)
    memory = MemoryLimit(par.memory_bytes, settings.micro_batches, settings.schedule)
    partition = read_json(inp.partition, schema="partition")
    first = partition_from_dict(pipeline, partition)
    requested = wildcard_budget(wc.budget)
    solver = SolverSettings(par.solver["time_limit_s"], par.solver["workers"], par.solver["seed"])
    scheduler = StageScheduler(graph.nodes, graph.tensors, bandwidth=read_host_link(inp.profile_summary),
                               budget=requested, solver=solver, swap=par.memory_model["swaps"],
                               pipeline=PipelineHold(first.k, settings.micro_batches, settings.schedule),
                               allocation=par.memory_model["device_type"])
    for res in read_stage_schedules(inp.schedules, [stage["nodes"] for stage in partition["stages"]]):
        scheduler.reuse(res.index, res.nodes, res.problem, res.ours)
    log.info("reused %d stage schedule(s) from %s", scheduler.reused, inp.schedules)
    result = balance(pipeline, tables, first, scheduler, settings, memory)
    head = {"model": wc.model, "device": wc.device, "k": first.k, **requested.fields(),
            "memory_model": dict(par.memory_model),
            "loss_chunk": graph.summary.get("spec", {}).get("loss_chunk")}  # how load_step retraces the model
    log.info("chosen iteration %d of %d (%s); %d stage schedules solved here", result.chosen,
             len(result.iterations), result.stop_reason, scheduler.solved)
    write_json(snakemake.output.iterations, {**head, **iterations_dict(result)})
    write_json(snakemake.output.plan, {**head, **plan_dict(pipeline, result, settings, memory)})
