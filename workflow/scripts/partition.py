"""Snakemake adapter: split one model's profiled graph into k pipeline stages."""

from trainplan.artifacts import read_profiled_graph
from trainplan.io import write_json
from trainplan.logs import log_to
from trainplan.partition import MemoryLimit, partition_graph, pipeline_graph, range_tables

with log_to(snakemake.log[0]) as log:
    inp, par = snakemake.input, snakemake.params
    graph = read_profiled_graph(inp.nodes, inp.tensors, inp.summary, inp.profile)
    pipeline = pipeline_graph(graph.nodes, graph.tensors)
    tables = range_tables(pipeline)
    memory = MemoryLimit(par.memory_bytes, par.micro_batches, par.pipeline_schedule)
    part = partition_graph(pipeline, tables, par.k, tolerance=par.tolerance, memory=memory)
    log.info("k=%d: cuts %s, bottleneck %.4f s, boundary bytes %d -> %d after %d moves", part.k, list(part.cuts),
             max(s.time_s for s in part.stages), part.refined.start_bytes, part.refined.end_bytes,
             len(part.refined.moves))
    write_json(snakemake.output[0], {
        "model": snakemake.wildcards.model,
        "device": snakemake.wildcards.device,
        "n_ops": pipeline.n,
        "n_forward": pipeline.n_forward,
        "tolerance": par.tolerance,
        "memory_limit": vars(memory),
        **part.to_dict(),
    })
