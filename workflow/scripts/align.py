"""Snakemake adapter: padding plan of every half-precision op of one model (seed 001), ours vs naive."""

from trainplan.align.plan import totals
from trainplan.align.study import model_summary, plan_model
from trainplan.export.trace import trace_training_step
from trainplan.io import write_json, write_table
from trainplan.logs import log_to
from trainplan.models import build_model
from trainplan.precision.assign import assign_precision
from trainplan.precision.policy import load_policy

with log_to(snakemake.log[0]) as log:
    model, p = snakemake.wildcards.model, snakemake.params
    traced, _ = trace_training_step(build_model(model, p.spec, seed=p.seed))
    policy = load_policy(snakemake.input.policy)
    dtypes = assign_precision(traced.gm, policy, traced.loss_node).dtype
    plans, table = plan_model(traced.gm, dtypes, p.granularity, tuple(p.dtypes), p.matmul_rule)
    summary = model_summary(model, plans, p.granularity, str(snakemake.input.policy), p.matmul_rule)
    log.info("model %s: %d half-precision ops, padded %d B (naive %d B), %.1f%% tensors aligned before",
             model, summary["ops"], summary["pad_bytes"], summary["naive_pad_bytes"], 100 * summary["share_aligned_before"])
    write_json(snakemake.output.plan, {"model": model, "granularity_bytes": p.granularity, "matmul_rule": p.matmul_rule,
                                       "ops": plans, "totals": totals(plans)})
    write_table(snakemake.output.ops, table)
    write_json(snakemake.output.summary, summary)
