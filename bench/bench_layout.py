"""Benchmark of the layout stage (seed 004); writes bench/results/layout.md.

1. Planner: random DAGs (residual joins) of 50-500 conv nodes with 2 and 3 layouts: the exact planner (frontier
   DP), CP-SAT and the paper's backtracking with early termination, each with ``--time-limit``; status, time,
   excess over the optimum, nodes explored.
2. Predictor: trained on the workflow's sweep, scored on every model's convs (held out).
3. Execution: the workflow's executed plans per model (measured step time per plan and baseline, the adopted
   plan re-timed on fresh rounds).
4. I/O: on small conv shapes, the simulated tiled dataflow's I/O over the red-blue-pebble bound; on the models'
   convs, the exact count of the workflow's `io.csv`.

    python bench/bench_layout.py --results results --device cpu --time-limit 10
    python bench/bench_layout.py --results RESULTS --device cuda --parts 2 3 --out bench/results/layout_cuda.md

Parts 2 and 3 read the workflow's `results/layout/*/<device>/` artifacts (skipped without them).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from trainplan.io import read_json, read_table
from trainplan.layout.iobound import ConvShape, lower_bound, paper_io, paper_tile, simulate_dataflow
from trainplan.layout.measure import load_average
from trainplan.layout.predict import fit, outside_sweep, score
from trainplan.layout.solve import backtrack, cpsat, frontier_dp, frontier_width
from trainplan.layout.summary import summary_row

OUT = Path(__file__).resolve().parent / "results" / "layout.md"
CLOCKS = {"process": "process CPU time", "wall": "wall clock"}


def table(frame: pd.DataFrame) -> str:
    """A markdown table (no extra dependency)."""
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row) + " |")
    return "\n".join(lines)


def planner(sizes: list[int], seeds: int, limit: float) -> pd.DataFrame:
    from trainplan.layout.synthetic import random_problem

    rows = []
    for n in sizes:
        for layouts in (("nchw", "nhwc"), ("nchw", "nhwc", "chwn")):
            for seed in range(seeds):
                p = random_problem(n, seed=seed, layouts=layouts)
                exact = frontier_dp(p)
                cp = cpsat(p, limit, 2, 0)
                bt = backtrack(p, limit)
                rows.append({"nodes": n, "edges": len(p.edges), "layouts": len(layouts), "seed": seed,
                             "width": frontier_width(p), "exact_status": exact.status, "exact_s": exact.solve_time_s,
                             "cpsat_status": cp.status, "cpsat_s": cp.solve_time_s,
                             "cpsat_excess": cp.time / exact.time - 1, "backtrack_status": bt.status,
                             "backtrack_s": bt.solve_time_s, "backtrack_excess": bt.time / exact.time - 1,
                             "backtrack_nodes": bt.extra["nodes_explored"]})
    return pd.DataFrame(rows)


def predictor(results: str, device: str, sweep_path: str | None) -> tuple[dict, pd.DataFrame] | None:
    sweep_path = sweep_path or f"{results}/layout/sweep/{device}/sweep.parquet"
    conv_paths = sorted(glob.glob(f"{results}/layout/*/{device}/convs.parquet"))
    if not os.path.exists(sweep_path) or not conv_paths:
        return None
    sweep = read_table(sweep_path)
    model = fit(sweep, ["nchw", "nhwc"], seed=0)
    per_model = []
    convs = []
    for path in conv_paths:
        c = read_table(path)
        name = Path(path).parts[-3]
        per_model.append({"model": name, **score(model, c, ["nchw", "nhwc"]), "outside_sweep": outside_sweep(sweep, c),
                          "spread": measured_spread(c)})
        convs.append(c)
    every = pd.concat(convs, ignore_index=True)
    pooled = score(model, every, ["nchw", "nhwc"])
    prefixes = {n: score(fit(sweep.iloc[:n], ["nchw", "nhwc"], seed=0), every, ["nchw", "nhwc"])["r2"]
                for n in (400, 800, 1200) if n < len(sweep)}
    return {"sweep_shapes": len(sweep), "sweep": sweep_path, **pooled, "in_range": sweep_split_r2(sweep),
            "prefixes": prefixes,
            "spread": measured_spread(every)}, pd.DataFrame(per_model)


def measured_spread(convs: pd.DataFrame) -> float:
    """The largest measured forward + backward time over the smallest, over every timed conv and layout: R^2 on
    seconds is small where this is, since a constant-efficiency guess already lies near every conv."""
    times = np.concatenate([(convs[f"fwd_{lay}"] + convs[f"bwd_{lay}"]).dropna().to_numpy()
                            for lay in ("nchw", "nhwc")])
    return float(times.max() / times.min())


def sweep_split_r2(sweep: pd.DataFrame, splits: int = 5, held: float = 0.2) -> list[tuple[float, float]]:
    """R^2 on seconds and on log seconds on a random fifth of the sweep's shapes when trained on the rest, per
    split: how well the predictor does on shapes inside the sweep's range, against the models' convs, which may
    lie beyond it."""
    rng = np.random.default_rng(0)
    r2 = []
    for _ in range(splits):
        order = rng.permutation(len(sweep))
        cut = int(held * len(sweep))
        model = fit(sweep.iloc[order[cut:]], ["nchw", "nhwc"], seed=0)
        scores = score(model, sweep.iloc[order[:cut]], ["nchw", "nhwc"])
        r2.append((scores["r2"], scores["r2_log"]))
    return r2


def timed_by(results: str) -> str:
    """Where ``bench/layout_device_data.py`` wrote the predictor's data (its ``meta.json``): what it timed on, at
    which settings, and how much of the sweep its budget reached."""
    path = Path(results) / "layout" / "meta.json"
    if not path.exists():
        return ""
    meta = read_json(path)
    lay, dev = meta["layout"], meta["runs"][0]["device"]
    where = (f"{dev['name']}, torch {dev['torch']}, CUDA {dev['cuda']}, cuDNN {dev['cudnn']}, TF32 "
             f"{'on' if dev['cudnn_allow_tf32'] else 'off'}" if dev["type"] == "cuda" else dev["type"])
    sweeps = [r["sweep"] for r in meta["runs"] if "sweep" in r]
    budgets = ", ".join(f"{r['budget_s']:g} s" for r in meta["runs"])
    reached = (f"the sweep's first {sweeps[-1]['timed']} of {sweeps[-1]['drawn']} drawn shapes" if sweeps
               else "no sweep shape")
    return (f" Timed by `bench/layout_device_data.py` in {len(meta['runs'])} run(s) on {where}: batch "
            f"{lay['batch_size']} x {lay['image_size']} px, {CLOCKS.get(lay['clock'], lay['clock'])}, median of "
            f"{lay['repeats']} runs of {lay.get('calls', 1)} back-to-back calls after {lay['warmup']} warm-up; "
            f"{reached} (at most {lay['sweep']['max_macs']:.0e} multiply-adds) timed within the runs' budgets "
            f"({budgets}).")


def timed_on(results: str, device: str) -> str:
    """How the executed plans were timed (clock, threads, device), as their artifacts say."""
    paths = sorted(glob.glob(f"{results}/layout/*/{device}/execution.json"))
    runs = {(e["clock"], e["threads"], json.dumps(e.get("device", {"type": "cpu"}), sort_keys=True))
            for e in map(read_json, paths)}
    said = []
    for clock, threads, dev in sorted(runs):
        facts = json.loads(dev)
        where = (f"{facts['name']}, torch {facts['torch']}, cuDNN {facts['cudnn']}, cuDNN TF32 "
                 f"{'on' if facts['cudnn_allow_tf32'] else 'off'}, synchronised" if facts["type"] == "cuda"
                 else f"{threads} thread(s)")
        said.append(f"{CLOCKS.get(clock, clock)}, {where}")
    return "; ".join(said)


def execution(results: str, device: str) -> pd.DataFrame | None:
    paths = sorted(glob.glob(f"{results}/layout/*/{device}/execution.json"))
    if not paths:
        return None
    s = pd.DataFrame([summary_row(read_json(p.replace("execution.json", "plan.json")), read_json(p)) for p in paths])
    cols = ["model", "convs", "status", "method", "solve_time_s", "backtrack_status", "backtrack_time_s", "n_nhwc",
            "best_single", "measured_best_single", "step_all_nchw_s", "step_all_nhwc_s", "step_planned_s",
            "predicted_planned_step_s",
            "step_predicted_plan_s", "speedup_vs_all_nchw", "speedup_vs_best_single", "speedup_ci95_low",
            "speedup_ci95_high", "slower_than_best_single", "faster_than_best_single", "adopted", "adopted_speedup",
            "adopted_ci95_low", "adopted_ci95_high", "adopted_slower_than_best_single", "regret_step_s", "gradients_ok", "load_max"]
    return s[cols]


def io_sim(sizes: list[int]) -> pd.DataFrame:
    shapes = {"3x3 s1 64->64 14px": ConvShape(1, 64, 14, 14, 64, 3, 3, (1, 1), (1, 1)),
              "3x3 s1 128->128 7px": ConvShape(1, 128, 7, 7, 128, 3, 3, (1, 1), (1, 1)),
              "1x1 s1 256->64 7px": ConvShape(1, 256, 7, 7, 64, 1, 1),
              "1x1 s1 64->256 14px": ConvShape(1, 64, 14, 14, 256, 1, 1),
              "3x3 s2 64->128 14px": ConvShape(1, 64, 14, 14, 128, 3, 3, (2, 2), (1, 1)),
              "7x7 s2 3->64 32px": ConvShape(1, 3, 32, 32, 64, 7, 7, (2, 2), (3, 3))}
    rows = []
    for name, c in shapes.items():
        for s in sizes:
            lb = lower_bound(c, s)
            x, y, z = paper_tile(c, s)
            t0 = time.perf_counter()
            sim = simulate_dataflow(c, s)
            rows.append({"conv": name, "S": s, "bound": lb["bound"], "bound_is": "pebble" if lb["pebble"] >= lb["compulsory"] else "compulsory",
                         "paper_tile": f"{x}x{y}x{z}", "paper_ratio": paper_io(c, x, y, z) / lb["bound"],
                         "sim_flow": sim["flow"].name, "sim_tile": "x".join(map(str, sim["tile"])),
                         "sim_keep": sim["flow"].keep, "sim_io": sim["io"],
                         "sim_ratio": sim["io"] / lb["bound"],
                         "sim_peak": sim["peak"], "sim_s": time.perf_counter() - t0})
    return pd.DataFrame(rows)


def models_io(results: str, device: str) -> str:
    """The workflow's `io.csv` over every model's convs: the exact dataflow count's ratio to the bound."""
    paths = sorted(glob.glob(f"{results}/layout/*/{device}/io.csv"))
    if not paths:
        return "The models' convs: skipped (no workflow results)."
    io = pd.concat([pd.read_csv(p).assign(model=Path(p).parts[-3]) for p in paths], ignore_index=True)
    per = io.groupby(["model", "S"]).exact_ratio.agg(convs="size", median="median", max="max",
                                                     within_1_2=lambda r: (r <= 1.2).mean()).reset_index()
    return (f"The models' own convs (the workflow's `io.csv`, batch of the layout stage; the exact count, which the "
            f"simulation reproduces where it runs): within 1.2x of the bound on {(io.exact_ratio <= 1.2).mean():.0%} "
            f"of {len(io)} (conv, S) rows; the dataflows chosen: "
            + ", ".join(f"{k} {v}" for k, v in io.sim_flow.value_counts().items())
            + f" ({int((io.sim_keep > 0).sum())} keeping input channels between output blocks).\n\n" + table(per))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="results")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200, 500])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--fast-memory", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--sweep", default=None, help="sweep table to train the predictor on (default: the workflow's)")
    ap.add_argument("--parts", type=int, nargs="+", default=[1, 2, 3, 4], help="which parts to run (1-4)")
    ap.add_argument("--out", type=Path, default=OUT, help="markdown file written")
    args = ap.parse_args()
    load0 = load_average()
    host = (f"Host load average at start: {load0:.1f} on {os.cpu_count()} cores: "
            + ("run alone on the host." if load0 < 1.0 else "timings below were **measured under load** (the host is shared).")
            if {1, 4} & set(args.parts) else "Nothing below is timed on the host that wrote it.")
    parts = [f"# Layout stage benchmark (seed 004)\n\nWritten by `python bench/bench_layout.py` at "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. {host}"
             + f" Parts 2 and 3 read the workflow's `{args.results}/layout/*/{args.device}/` artifacts; part 3 comes "
             f"from the workflow's runs, each with its own load average (`load_max`)."]
    for part in sorted(set(args.parts)):
        parts.append(PARTS[part](args))
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text("\n\n".join(parts) + "\n")
    print(args.out.read_text())


def planner_part(args: argparse.Namespace) -> str:
    plan = planner(args.sizes, args.seeds, args.time_limit)
    ok = (plan.exact_status == "optimal").all() and (plan.exact_s <= args.time_limit).all()
    return (f"## 1. Exact planner vs CP-SAT vs the paper's backtracking (time limit {args.time_limit:g} s)\n\n"
            f"Target: proven optimal on random DAGs up to 500 nodes within {args.time_limit:g} s: "
            f"**{'met' if ok else 'NOT met'}** (largest exact solve {plan.exact_s.max():.3f} s). "
            f"`excess`: plan time over the optimum.\n\n" + table(plan))


def predictor_part(args: argparse.Namespace) -> str:
    pred = predictor(args.results, args.device, args.sweep)
    if pred is None:
        return "## 2. Predictor\n\nSkipped: no workflow results (run the layout targets first)."
    pooled, per_model = pred
    return (f"## 2. Conv-time predictor on held-out model convs\n\nGradient-boosted trees (scikit-learn, log time "
            f"per multiply-add) on "
            f"{pooled['sweep_shapes']} random sweep shapes x 2 layouts (`{pooled['sweep']}`); scored on every model's own convs "
            f"(never in training).{timed_by(args.results)} Pooled: R^2 = {pooled['r2']:.3f} (on log time "
            f"{pooled['r2_log']:.3f}; the measured times span {pooled['spread']:.0f}x), "
            f"median relative error {pooled['median_rel_error']:.3f}, faster layout picked right "
            f"{pooled['layout_choice_agreement']:.0%} of convs. Target R^2 >= 0.9: "
            f"**{'met' if pooled['r2'] >= 0.9 else 'NOT met'}**. Trained on the sweep's first shapes only (a random "
            f"sample of it), pooled R^2: "
            + "".join(f"{n}: {r2:.3f}, " for n, r2 in pooled["prefixes"].items())
            + f"all {pooled['sweep_shapes']}: {pooled['r2']:.3f}. `outside_sweep`: the model's convs with more "
            f"multiply-adds or a larger input side than any sweep shape (the trees predict them as the sweep's "
            f"largest). `spread`: the model's largest measured conv time over its smallest (R^2 on seconds is low "
            f"where it is small). Within the sweep's range (trained on a random 80% of its shapes, scored on the "
            f"rest, 5 splits): R^2 {', '.join(f'{a:.3f}' for a, _ in pooled['in_range'])}; on log time "
            f"{', '.join(f'{b:.3f}' for _, b in pooled['in_range'])}.\n\n" + table(per_model))


def execution_part(args: argparse.Namespace) -> str:
    ex = execution(args.results, args.device)
    if ex is None:
        return "## 3. Executed plans\n\nSkipped: no workflow results."
    return (f"## 3. Executed plans (training step, forward + backward; {timed_on(args.results, args.device)})\n\n"
            "Median of the workflow's `layout.step_repeats` alternating runs per plan; beyond noise: the 95% "
            "paired bootstrap interval of the speedup over the measured fastest single layout lies wholly "
            "below (slower) or above (faster) 1. Target: mixed layouts never slower beyond noise: exact plan "
            f"**{'met' if not ex.slower_than_best_single.any() else 'NOT met'}** (slower on "
            f"{int(ex.slower_than_best_single.sum())} model(s)); the adopted plan (the exact plan only where it "
            f"measured faster beyond noise, re-timed on fresh rounds: `adopted_*`) "
            f"**{'met' if not ex.adopted_slower_than_best_single.any() else 'NOT met'}**. Target: faster on at "
            f"least one model: exact plan faster beyond noise on {int(ex.faster_than_best_single.sum())} "
            f"model(s), adopted plan on {int((ex.adopted_ci95_low > 1.0).sum())} (on fresh rounds).\n\n" + table(ex))


def io_part(args: argparse.Namespace) -> str:
    io = io_sim(args.fast_memory)
    return ("## 4. Simulated dataflow I/O over the lower bound\n\nFast memory of exactly S elements holding the "
            "tile's partial sums and its stream's buffer (`sim_flow`: `output/rows` the paper's output-stationary "
            "order, kernel slices resident and the input one row at a time; `output/taps` the patch resident and "
            "the kernels one tap at a time; `input/taps` a spatial tile's patches of every channel resident; "
            "`sim_keep`: input channels of an output-order tile kept on chip for its next output block); the "
            "order, stream, tile and kept channels with the least I/O; reads and writes counted by simulation. "
            "Target: within "
            f"1.2x of the bound: met on {int((io.sim_ratio <= 1.2).sum())} of {len(io)} rows (paper's formula "
            f"with its tile, no buffers or halos: {int((io.paper_ratio <= 1.2).sum())} of {len(io)}).\n\n"
            + table(io) + "\n\n" + models_io(args.results, args.device))


PARTS = {1: planner_part, 2: predictor_part, 3: execution_part, 4: io_part}


if __name__ == "__main__":
    main()
