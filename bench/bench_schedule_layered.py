"""Benchmark the scheduler on random layered DAGs (Gagrani et al. 2022, Appendix A; Moccasin's evaluation).

For each size, seed and swap setting, budgets of 90/80/70% of the plain topological order's peak (the
no-recompute replay in program order), or multiples of the memory floor (``--budget-of floor``): our solver
(``solve``, bisection on, as ``trainplan schedule`` runs it) and every baseline, each with the same time
limit. Every number comes from replaying events; wall time is measured around each call and given as a ratio
to the limit. Writes
bench/results/schedule_layered.md and .csv; timings are taken on a shared host (label them with --load).

    nice python bench/bench_schedule_layered.py --sizes 100 250 500 1000 2000 --seeds 0 1 2 --time-limit 60
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from trainplan.io import atomic_path, write_table
from trainplan.schedule import METHODS, replay, solve
from trainplan.schedule.baselines import no_recompute_events
from trainplan.schedule.synthetic import layered_graph

FRACTIONS = (0.9, 0.8, 0.7)
BUDGET_OF = {"peak": "fraction of the plain topological order's peak",
             "floor": "multiple of the memory floor (fixed bytes + the largest single op's inputs, output and "
                      "workspace, or the keep set; `peak_fraction` in the CSV: the budget as a fraction of the "
                      "plain peak)"}
RESULTS = Path(__file__).parent / "results"


def overhead(time_s: float | None, base: float) -> float | None:
    return None if time_s is None else 100 * (time_s / base - 1)


def run_case(n: int, seed: int, swap: bool, frac: float, args: argparse.Namespace) -> dict:
    p = layered_graph(n, seed, swap=swap)
    peak = replay(p, no_recompute_events(p)).peak_bytes
    prob = p.with_budget(int(frac * (p.floor_bytes if args.budget_of == "floor" else peak)))
    t0 = time.perf_counter()
    ours = solve(prob, args.time_limit, args.workers, args.seed)
    wall = time.perf_counter() - t0
    base = prob.compute_time
    row = {"n": n, "seed": seed, "swap": swap, "fraction": frac, "budget_bytes": prob.budget_bytes,
           "floor_bytes": prob.floor_bytes, "peak_fraction": prob.budget_bytes / peak, "status": ours.status,
           "budget_status": ours.extra.get("budget_status"), "schedule_budget_bytes": ours.budget_bytes,
           "overhead_pct": overhead(ours.time, base), "heuristic": ours.extra.get("heuristic"),
           # the proven lower bound on the overhead at the requested budget (none for a raised budget)
           "bound_overhead_pct": overhead(ours.bound, base) if ours.budget_bytes == prob.budget_bytes else None,
           "first_feasible_s": ours.extra.get("first_feasible_seconds"), "wall_s": wall,
           # an unmet budget's known-feasible budget: recomputing from scratch (none where swap met it)
           "scratch_bound_bytes": (ours.extra.get("scratch_bound") or {}).get("bytes"),
           "wall_over_limit": wall / args.time_limit}
    best = None
    for method in METHODS:
        if method == "ours" or method in args.skip:
            continue
        t0 = time.perf_counter()
        s = solve(prob, args.time_limit, args.workers, args.seed, method=method)
        row[f"{method}_wall_over_limit"] = (time.perf_counter() - t0) / args.time_limit
        if s.ok and (best is None or s.time < best[1]):
            best = (method, s.time)
    row["best_baseline"] = None if best is None else best[0]
    row["best_baseline_overhead_pct"] = None if best is None else overhead(best[1], base)
    return row


def markdown(frame: pd.DataFrame, args: argparse.Namespace) -> str:
    def fmt(v: object, spec: str = ".2f") -> str:
        return "-" if v is None or (isinstance(v, float) and pd.isna(v)) else format(v, spec)

    lines = [
        "# Scheduler on random layered DAGs",
        "",
        f"Written by `bench/bench_schedule_layered.py` (sizes {' '.join(map(str, args.sizes))}, seeds "
        f"{' '.join(map(str, args.seeds))}, time limit {args.time_limit:g} s, {args.workers} workers, "
        f"deterministic CP-SAT). Budget = {BUDGET_OF[args.budget_of]}; overhead = replayed "
        f"time / sum of op times - 1; a raised budget (bisection) shows the raised budget's overhead and "
        f"`budget_status` says what is known about the requested one. Wall time is measured around the "
        f"in-process call (no interpreter start-up). {args.load}",
        "",
        "`proven >=`: the schedule's proven lower bound as an overhead (no schedule at this budget can do better).",
        "",
        "`exists at`: for a budget not met, the budget at which a recompute-only schedule is known to exist "
        "(recomputing from scratch), as a multiple of the requested budget.",
        "",
        "| n | seed | swap | budget | status | budget_status | raised to | exists at | overhead | proven >= | "
        "heuristic | wall s | wall/limit | best baseline | its overhead | max baseline wall/limit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in frame.to_dict("records"):
        raised = "-" if r["schedule_budget_bytes"] == r["budget_bytes"] else \
            f"{r['schedule_budget_bytes'] / r['budget_bytes']:.3f}x"
        scratch = r.get("scratch_bound_bytes")
        exists = "-" if scratch is None or pd.isna(scratch) else f"{scratch / r['budget_bytes']:.3f}x"
        walls = [v for k, v in r.items() if k.endswith("_wall_over_limit") and k != "wall_over_limit"]
        lines.append(
            f"| {r['n']} | {r['seed']} | {'on' if r['swap'] else 'off'} | {r['fraction']:.0%} | {r['status']} | "
            f"{r['budget_status']} | {raised} | {exists} | {fmt(r['overhead_pct'])}% | "
            f"{fmt(r.get('bound_overhead_pct'))}% | {r['heuristic']} | "
            f"{r['wall_s']:.2f} | {r['wall_over_limit']:.3f} | {fmt(r['best_baseline'], 's')} | "
            f"{fmt(r['best_baseline_overhead_pct'])}% | {fmt(max(walls) if walls else None, '.3f')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 250, 500, 1000, 2000])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS))
    ap.add_argument("--budget-of", choices=sorted(BUDGET_OF), default="peak",
                    help="what --fractions are fractions of")
    ap.add_argument("--swap", choices=["off", "on", "both"], default="both")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="solver seed")
    ap.add_argument("--skip", nargs="*", default=[], help="baselines not to run")
    ap.add_argument("--load", default="Measured on the shared 2-core host while other jobs ran (under load).")
    ap.add_argument("--out", default=str(RESULTS / "schedule_layered"), help="output stem (.md and .csv)")
    args = ap.parse_args()
    swaps = {"off": [False], "on": [True], "both": [False, True]}[args.swap]
    rows = []
    for n in args.sizes:
        for seed in args.seeds:
            for swap in swaps:
                for frac in args.fractions:
                    rows.append(run_case(n, seed, swap, frac, args))
                    r = rows[-1]
                    print(f"n={n} seed={seed} swap={swap} {frac:.0%}: {r['status']} {r['budget_status']} "
                          f"overhead {r['overhead_pct']} wall/limit {r['wall_over_limit']:.3f} "
                          f"best baseline {r['best_baseline']} {r['best_baseline_overhead_pct']}", flush=True)
                    frame = pd.DataFrame(rows)
                    write_table(f"{args.out}.csv", frame)
                    with atomic_path(f"{args.out}.md") as tmp:
                        tmp.write_text(markdown(frame, args))


if __name__ == "__main__":
    main()
