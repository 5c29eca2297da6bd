"""Time the layout predictor's data on a device within a time budget, for ``bench_layout.py --parts 2``.

Every study CNN's convs at the config's layout size (the held-out set: ``RESULTS/layout/<model>/<device>/
convs.parquet``), then the sweep's random conv shapes until the budget ends (``RESULTS/layout/sweep/<device>/
sweep.parquet``: the shapes timed before it, a random sample of the config's sweep; ``--resume`` goes on from
there). Timed with the ``Timing`` the config gives the workflow's rules, each conv by ``conv_time`` in the sweep's
worker process (``layout_measure`` times the models' convs in its own process), without the groups and
transforms the predictor does not use: for a lent GPU whose time is too short for the whole study there
(docs/layout.md). ``meta.json`` beside the tables says what ran where and for how long.

    python bench/layout_device_data.py --configfile config/config.yaml config/cuda.yaml --budget 480
    python bench/bench_layout.py --results RESULTS --device cuda --parts 2 --out bench/results/layout_cuda_predictor.md
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from trainplan.io import merged_yaml, read_json, read_table, write_json, write_table
from trainplan.layout.graph import trace_conv_graph
from trainplan.layout.measure import device_facts, input_grads, time_in_worker
from trainplan.layout.predict import measure_sweep, sweep_shapes
from trainplan.layout.settings import layout_spec, timing_of
from trainplan.models import build_model, on_device


def model_convs(name: str, cfg: dict[str, Any], device: str, deadline: float, log: logging.Logger) -> pd.DataFrame:
    """One model's convs traced on ``device`` at the layout stage's size, each timed in every layout."""
    settings = cfg["layout"]
    built = on_device(build_model(name, layout_spec(cfg["models"][name], settings), seed=cfg["seed"]), device)
    graph = trace_conv_graph(built.name, built.module, built.batch)
    del built
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()  # the GPU's memory to the timing worker
    grads = input_grads(graph)
    ids = list(graph.convs)
    rows = time_in_worker([graph.convs[c] for c in ids], [grads[c] for c in ids], settings["layouts"],
                          timing_of(settings, device=device), log, deadline=deadline)
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configfile", nargs="+", default=["config/config.yaml", "config/cuda.yaml"])
    ap.add_argument("--budget", type=float, required=True, help="seconds: no conv or sweep shape starts after it")
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--models", nargs="*", default=None, help="default: the config's study.layout")
    ap.add_argument("--resume", action="store_true",
                    help="keep the models already timed under --results and go on with the sweep where it stopped")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    log = logging.getLogger("layout_device_data")
    start = time.time()
    cfg = merged_yaml(args.configfile)
    settings, device = cfg["layout"], cfg["devices"][cfg["device"]]["type"]
    deadline = start + args.budget
    meta_path = args.results / "layout" / "meta.json"
    runs = read_json(meta_path)["runs"] if args.resume and meta_path.exists() else []
    meta: dict[str, Any] = {"configfile": args.configfile, "budget_s": args.budget, "device": device_facts(device),
                            "models": {}}
    for name in args.models or cfg["study"]["layout"]:
        path = args.results / "layout" / name / device / "convs.parquet"
        if args.resume and path.exists():
            continue
        t0 = time.time()
        convs = model_convs(name, cfg, device, deadline, log)
        write_table(path, convs)
        meta["models"][name] = {"convs": len(convs), "seconds": time.time() - t0}
        log.info("%s: %d convs timed in %.1f s", name, len(convs), time.time() - t0)
        write_json(meta_path, {"layout": settings, "runs": [*runs, meta]})
    sweep = settings["sweep"]
    shapes = sweep_shapes(sweep["shapes"], sweep["seed"], settings["batch_size"], sweep["max_macs"],
                          settings["image_size"])
    path = args.results / "layout" / "sweep" / device / "sweep.parquet"
    before = read_table(path) if args.resume and path.exists() else pd.DataFrame()
    t0 = time.time()
    table = pd.concat([before, measure_sweep(shapes[len(before):], settings["layouts"],
                                             timing_of(settings, device=device), log,
                                             time_limit=max(deadline - t0, 1e-9))], ignore_index=True)
    write_table(path, table)
    meta["sweep"] = {"drawn": len(shapes), "from": len(before), "timed": len(table), "seconds": time.time() - t0}
    meta["total_s"] = time.time() - start
    write_json(meta_path, {"layout": settings, "runs": [*runs, meta]})
    log.info("sweep: shapes %d-%d of %d timed in %.1f s; total %.1f s", len(before), len(table), len(shapes),
             time.time() - t0, meta["total_s"])


if __name__ == "__main__":
    main()
