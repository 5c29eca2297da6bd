"""Snakemake adapter: schedule each stage at the budget, re-partition for balance, compare with the DP.

The first partition's stages reuse the schedule rule's schedules (same stages, budget and solver settings).
"""

from pathlib import Path

from trainplan.artifacts import read_host_link, read_profiled_graph
from trainplan.io import ArtifactError, read_json, write_json
from trainplan.schedule import problem_from_dict
from trainplan.schedule.schedule_io import schedule_from_dict
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

with log_to(snakemake.log[0]) as log:
    inp, par, wc = snakemake.input, snakemake.params, snakemake.wildcards
    graph = read_profiled_graph(inp.nodes, inp.tensors, inp.summary, inp.profile)
    pipeline = pipeline_graph(graph.nodes, graph.tensors)
    tables = range_tables(pipeline)
    settings = BalanceSettings(**par.balance)
    memory = MemoryLimit(par.memory_bytes, settings.micro_batches)
    first = partition_from_dict(pipeline, read_json(inp.partition, schema="partition"))
    solver = SolverSettings(par.solver["time_limit_s"], par.solver["workers"], par.solver["seed"])
    scheduler = StageScheduler(graph.nodes, graph.tensors, bandwidth=read_host_link(inp.profile_summary),
                               budget_fraction=par.budget_fraction, solver=solver)
    for path in sorted(Path(inp.schedules).glob("stage*[0-9].json")):
        raw = read_json(path, schema="schedule")
        problem = read_json(Path(inp.problems) / path.name, schema="problem")
        try:
            schedule = schedule_from_dict(problem_from_dict(problem), raw)
        except ValueError as exc:  # events that do not replay to the stated numbers, or a bad problem
            raise ArtifactError(f"{path}: {exc}") from exc
        scheduler.reuse(raw.pop("stage_nodes"), problem, schedule)
    log.info("reused %d stage schedule(s) from %s", scheduler.reused, inp.schedules)
    result = balance(pipeline, tables, first, scheduler, settings, memory)
    head = {"model": wc.model, "device": wc.device, "k": first.k, "budget_fraction": par.budget_fraction}
    log.info("chosen iteration %d of %d (%s); %d stage schedules solved here", result.chosen,
             len(result.iterations), result.stop_reason, scheduler.solved)
    write_json(snakemake.output.iterations, {**head, **iterations_dict(result)})
    write_json(snakemake.output.plan, {**head, **plan_dict(pipeline, result, settings, memory)})
