"""Snakemake adapter: time a sweep of random conv shapes in every layout (the predictor's training data)."""

import torch

from trainplan.io import write_table
from trainplan.layout.predict import measure_sweep, sweep_shapes
from trainplan.layout.settings import timing_of
from trainplan.logs import log_to

with log_to(snakemake.log[0]) as log:
    settings, device = snakemake.params.settings, snakemake.params.device_type
    sweep = settings["sweep"]
    torch.manual_seed(snakemake.params.seed)
    shapes = sweep_shapes(sweep["shapes"], sweep["seed"], settings["batch_size"], sweep["max_macs"],
                          settings["image_size"])
    log.info("timing %d conv shapes in %s on %s (%s clock, %d thread(s))", len(shapes), settings["layouts"], device,
             settings["clock"], settings["threads"])
    table = measure_sweep(shapes, settings["layouts"], timing_of(settings, device=device), log, sweep.get("time_limit"))
    if table.empty:
        raise SystemExit(f"layout.sweep.time_limit of {sweep['time_limit']} s ran out before the first conv shape was "
                         f"timed: raise it")
    write_table(snakemake.output.table, table)
