"""Snakemake adapter: trace one model's training step and write its graph artifacts."""

import time

import torch

from trainplan.artifacts import write_graph
from trainplan.export.tables import graph_tables, memory_table
from trainplan.export.trace import trace_training_step
from trainplan.fuse.planned import gradients_vs_unfused
from trainplan.io import write_table
from trainplan.logs import log_to
from trainplan.models import build_model, on_device

with log_to(snakemake.log[0]) as log:
    name = snakemake.wildcards.model
    start = time.perf_counter()
    backend = snakemake.wildcards.backend
    built = on_device(build_model(name, snakemake.params.spec, seed=snakemake.params.seed), backend)
    traced, _ = trace_training_step(built)
    tables = graph_tables(traced)
    memory, mem_summary = memory_table(tables)
    summary = {
        **tables.summary,
        **mem_summary,
        "spec": snakemake.params.spec,
        "seed": snakemake.params.seed,
        "trace_device": backend,
        "torch": torch.__version__,
        "export_seconds": time.perf_counter() - start,
    }
    fusion = getattr(built.module, "fusion", None)  # a fused model '<model>+<target>' (trainplan.fuse.planned)
    if fusion:
        log.info("fused model: %d groups (%d forward ops) as fused ops, %d of them as fx graphs, %d left as ops",
                 fusion["groups_fused"], fusion["ops_fused"], fusion["groups_fx"], fusion["groups_unfused"])
        check = gradients_vs_unfused(built, snakemake.params.spec, **snakemake.params.fused_check)
        summary["fusion"] = {**fusion, "gradients_vs_unfused": check}
        log.info("fused model's gradients against the unfused model's (both against float64): worst ratio %.3g at "
                 "%s (eager's own: %.3g)%s; passed: %s", check["fused"]["worst_ratio"], check["fused"]["worst_at"],
                 check["eager"]["worst_ratio"], f"; in float64 {check['float64']}" if "float64" in check else "",
                 check["passed"])
    log.info("model %s on %s: %d ops (%d forward, %d backward), peak %.1f MiB at %s",
             name, backend, summary["n_ops"], summary["n_forward"], summary["n_backward"],
             summary["peak_bytes"] / 2**20, summary["peak_node"])
    write_table(snakemake.output.memory, memory)
    write_graph(snakemake.output.nodes, snakemake.output.tensors, snakemake.output.summary,
                tables.nodes, tables.tensors, summary)
