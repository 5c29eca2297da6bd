"""Benchmark Checkmate's baselines: the MILP (where built) against its LP relaxation with rounding, and ours.

Layered training graphs (``synthetic.training_graph``) at fractions of the no-recompute peak; every method
gets the same time limit. Writes a Markdown table (every number replayed from the method's events) to
--out and prints it.

    nice python bench/bench_checkmate.py --sizes 40 100 200 300 --time-limit 10
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from host_load import load_label
from trainplan.io import atomic_path
from trainplan.schedule import SolveOptions, replay, solve
from trainplan.schedule.baselines import no_recompute_events
from trainplan.schedule.checkmate import checkmate, model_size
from trainplan.schedule.checkmate_lp import checkmate_lp, lp_variables
from trainplan.schedule.synthetic import training_graph


def cells(name: str, s, compute: float, limit: float, wall: float) -> list[str]:
    over = "-" if s.time is None else f"{100 * (s.time / compute - 1):.2f}%"
    ratio = "-" if s.peak_bytes is None else f"{s.peak_bytes / s.budget_bytes:.3f}"
    how = s.extra.get("milp_status") if s.extra.get("variant") == "milp" else (
        f"LP {s.extra.get('lp_status')}, {(s.extra.get('rounding') or {}).get('best')}" if name != "ours" else
        s.extra.get("heuristic", ""))
    return [name, s.status, over, ratio, str(how), f"{wall:.1f}", f"{wall / limit:.2f}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[40, 100, 200, 300])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.9, 0.7])
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results/checkmate_lp.md")
    args = ap.parse_args()
    loads = [os.getloadavg()[0]]
    lines = [f"# bench_checkmate: time limit {args.time_limit:g} s per method, seed {args.seed}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "overhead = replayed time / sum of op times - 1; peak / budget > 1: over budget; wall / limit: the time"
             " limit kept (<= 1.05).",
             "",
             "| n | budget | MILP variables | LP variables | method | status | overhead | peak / budget | how | wall s |"
             " wall / limit |",
             "|" + "---|" * 11]
    print("\n".join(lines), flush=True)
    for n in args.sizes:
        g = training_graph(n, args.seed)
        peak = replay(g, no_recompute_events(g)).peak_bytes
        for frac in args.fractions:
            p = g.with_budget(g.fixed_bytes + int(frac * (peak - g.fixed_bytes)))
            runs = {"checkmate": lambda: checkmate(p, time_limit_s=args.time_limit, seed=args.seed),
                    "checkmate LP rounding": lambda: checkmate_lp(p, time_limit_s=args.time_limit, seed=args.seed),
                    "ours": lambda: solve(p, args.time_limit, 2, args.seed, options=SolveOptions(bisect=False))}
            for name, run in runs.items():
                t0 = time.perf_counter()
                s = run()
                wall = time.perf_counter() - t0
                row = [str(g.n), f"{frac:.0%}", str(model_size(g)), str(lp_variables(g)),
                       *cells(name, s, g.compute_time, args.time_limit, wall)]
                lines.append("| " + " | ".join(row) + " |")
                print(lines[-1], flush=True)
                loads.append(os.getloadavg()[0])
    lines[2:2] = [f"Timings {load_label(loads)}.", ""]
    with atomic_path(Path(args.out)) as tmp:
        tmp.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
