"""Snakemake adapter: trace one CNN's conv graph and time its convs, the ops between them and the layout
transforms on every edge, in every layout, on the study's device; write the tables and the measured layout
problem."""

from trainplan.io import write_json, write_table
from trainplan.layout.build import build_problem
from trainplan.layout.graph import trace_conv_graph
from trainplan.layout.measure import device_facts, load_average, measure_graph
from trainplan.layout.settings import layout_spec, timing_of
from trainplan.logs import log_to
from trainplan.models import build_model, on_device
from trainplan.timing import keep_freed_memory

with log_to(snakemake.log[0]) as log:
    settings, device = snakemake.params.settings, snakemake.params.device_type
    allocator = keep_freed_memory()  # before anything is allocated; measure_graph keeps it so for library callers
    built = on_device(build_model(snakemake.wildcards.model, layout_spec(snakemake.params.spec, settings),
                                  seed=snakemake.params.seed), device)
    graph = trace_conv_graph(built.name, built.module, built.batch)
    log.info("%s on %s: %d convs, %d ops between them, %d edges (load average %.1f)", built.name, device,
             len(graph.convs), len(graph.ops), len(graph.edges), load_average())
    tables = measure_graph(graph, settings["layouts"], timing_of(settings, device=device), log)
    failed = tables["groups"].loc[tables["groups"].error != ""]
    for row in failed.itertuples():
        log.warning("group %s not replayed (%s): costed as measured-equal", row.group, row.error)
    problem = build_problem(built.name, tables["convs"], tables["groups"], tables["edges"], settings["layouts"],
                            meta={"clock": settings["clock"], "threads": settings["threads"], "load_average": load_average(),
                                  "host_allocator": allocator, "device": device_facts(device)})
    for name in ("convs", "groups", "edges"):
        write_table(snakemake.output[name], tables[name])
    write_json(snakemake.output.problem, problem.to_dict())
