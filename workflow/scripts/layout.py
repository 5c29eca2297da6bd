"""Snakemake adapter: plan one CNN's layouts exactly (measured and predicted costs, every baseline), execute
the plans on the real training step, check gradients, store predicted and measured step times."""

from trainplan.io import read_table, write_json, write_table
from trainplan.layout.settings import layout_spec
from trainplan.layout.study import run_layout
from trainplan.logs import log_to
from trainplan.models import build_model, on_device

with log_to(snakemake.log[0]) as log:
    settings, device = snakemake.params.settings, snakemake.params.device_type
    built = on_device(build_model(snakemake.wildcards.model, layout_spec(snakemake.params.spec, settings),
                                  seed=snakemake.params.seed), device)
    tables = {name: read_table(snakemake.input[name]) for name in ("convs", "groups", "edges")}
    plan, execution, predictions = run_layout(built, tables, read_table(snakemake.input.sweep), settings,
                                              snakemake.params.solver, snakemake.params.seed, device)
    log.info("%s: plan %s time %.6g s (bound %.6g); step %.4f s planned vs %.4f s best single (%s); gradients %s",
             built.name, plan["status"], plan["time"], plan["bound"], execution["configs"]["planned"]["measured_step_s"],
             execution["configs"]["best_single"]["measured_step_s"], execution["configs"]["best_single"]["ran_as"],
             "ok" if execution["gradients_ok"] else "MISMATCH")
    write_json(snakemake.output.plan, plan)
    write_json(snakemake.output.execution, execution)
    write_table(snakemake.output.predictions, predictions)
