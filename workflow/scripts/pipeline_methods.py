"""Snakemake adapter: the partition methods of `pipeline.methods` and ours run as pipelines with one schedule and m
(trainplan.pipeline.compare), a table row per method; each run's plan and artifact under the `runs` folder. Every
method's stages are budgeted for this run's schedule and m (its in-flight micro-batches held); ours is the
pipeline_plan rule's, made for them too."""

from dataclasses import replace
from pathlib import Path

import pandas as pd

from trainplan.artifacts import read_host_link, read_profiled_graph
from trainplan.budget import wildcard_budget
from trainplan.io import read_json, write_json, write_table
from trainplan.logs import log_to
from trainplan.partition import BalanceSettings, MemoryLimit, SolverSettings
from trainplan.pipeline.compare import OURS, add_plan, comparison_row, method_plans, run_plan
from trainplan.pipeline.run import RunSettings

with log_to(snakemake.log[0]) as log:
    inp, par, wc = snakemake.input, snakemake.params, snakemake.wildcards
    graph = read_profiled_graph(inp.nodes, inp.tensors, inp.summary, inp.profile)
    k, m, v = int(wc.k), int(wc.m), int(par.stages_per_rank)
    settings = replace(BalanceSettings(**par.balance), micro_batches=m, schedule=wc.schedule)
    plans = method_plans(wc.model, wc.device, graph.nodes, graph.tensors, k, wildcard_budget(wc.budget),
                         bandwidth=read_host_link(inp.profile_summary), swaps=par.memory_model["swaps"],
                         solver=SolverSettings(par.solver["time_limit_s"], par.solver["workers"], par.solver["seed"]),
                         settings=settings, memory=MemoryLimit(par.memory_bytes, settings.micro_batches),
                         methods=tuple(par.settings["methods"]), allocation=par.memory_model["device_type"],
                         stages_per_rank=v)
    add_plan(plans, OURS, read_json(inp.plan, schema="plan"))
    runs, rows = {}, []
    for method, plan in plans.items():
        where = Path(snakemake.output.runs) / method
        ran = plan.get("same_as") or method
        if "error" not in plan and ran not in runs:
            write_json(where / "plan.json", {**plan, "memory_model": dict(par.memory_model)})
            settings_run = RunSettings(where / "plan.json", wc.model, dict(par.spec), wc.schedule, m,
                                       where / "run.json", par.seed, par.settings["warmup"], par.settings["threads"],
                                       False, par.device["type"], par.settings["repeats"],
                                       par.settings["tied_grads"], v)
            runs[ran] = run_plan(where / "plan.json", settings_run, settings_run.ranks(k))
        rows.append({"model": wc.model, "budget": wc.budget, "method": method, "schedule": wc.schedule, "m": m,
                     **comparison_row(plan, runs.get(ran, {}))})
        log.info("%s: %s", method, rows[-1].get("measured_step_s", rows[-1].get("error")))
    Path(snakemake.output.runs).mkdir(parents=True, exist_ok=True)
    write_table(snakemake.output.table, pd.DataFrame(rows))
