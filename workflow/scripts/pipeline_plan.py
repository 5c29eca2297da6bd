"""Snakemake adapter: our plan for one pipeline run's schedule and m (trainplan.pipeline.compare): the balance
rule's plan where its ranks' budgets hold what the run has in flight, else balanced here for them."""

from dataclasses import replace

from trainplan.artifacts import read_host_link, read_profiled_graph
from trainplan.budget import wildcard_budget
from trainplan.io import read_json, write_json
from trainplan.logs import log_to
from trainplan.partition import BalanceSettings, MemoryLimit, SolverSettings
from trainplan.pipeline.compare import OURS, as_method, method_plans
from trainplan.pipeline.errors import PipelineError
from trainplan.pipeline.report import holds_run
from trainplan.schedule.pipeline_hold import in_flight

with log_to(snakemake.log[0]) as log:
    inp, par, wc = snakemake.input, snakemake.params, snakemake.wildcards
    k, m, v = int(wc.k), int(wc.m), int(par.stages_per_rank)
    balanced = read_json(inp.plan, schema="plan")
    if all(holds_run(balanced["stages"], wc.schedule, m, [in_flight(s, k, m, wc.schedule, v) for s in range(k)])):
        log.info("model '%s': the balance rule's plan holds %s with m=%d", wc.model, wc.schedule, m)
        plan = as_method(balanced, OURS)
    else:
        log.info("model '%s': balancing for %s with m=%d (the balance rule's plan holds other micro-batches in "
                 "flight)", wc.model, wc.schedule, m)
        graph = read_profiled_graph(inp.nodes, inp.tensors, inp.summary, inp.profile)
        settings = replace(BalanceSettings(**par.balance), micro_batches=m, schedule=wc.schedule)
        plan = method_plans(wc.model, wc.device, graph.nodes, graph.tensors, k, wildcard_budget(wc.budget),
                            bandwidth=read_host_link(inp.profile_summary), swaps=par.memory_model["swaps"],
                            solver=SolverSettings(par.solver["time_limit_s"], par.solver["workers"],
                                                  par.solver["seed"]),
                            settings=settings, memory=MemoryLimit(par.memory_bytes, m), methods=(OURS,),
                            allocation=par.memory_model["device_type"], stages_per_rank=v)[OURS]
        if "error" in plan:
            raise PipelineError(plan["error"])
    write_json(snakemake.output[0], {**plan, "memory_model": dict(par.memory_model)})
