"""Benchmark the recompute/swap scheduler against the baselines.

Layered random training graphs (seeded: forward chain with skips, mirrored backward reading the
forward activations) at budgets of 90/80/70/50% of the no-recompute peak and 1.1 x the memory
floor, or every problem JSON (and every stage of every schedules.json) under --problems DIR at its own budget. Prints a Markdown table; every
number comes from replaying the method's events.

    python bench/bench_schedule.py --sizes 100 250 500 1000 2000 --time-limit 10 --workers 2
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from trainplan.io import read_json
from trainplan.schedule import METHODS, SolveOptions, compare, load_problem, replay, solve
from trainplan.schedule.baselines import no_recompute_events
from trainplan.schedule.problem import Problem
from trainplan.schedule.synthetic import training_graph

FRACTIONS = (0.9, 0.8, 0.7, 0.5)
RC_ONLY = "ours_recompute_only"  # our solver with swapping disabled: the recompute-only reference


def cases(args: argparse.Namespace) -> list[tuple[str, Problem]]:
    """(label, problem) pairs: synthetic sizes x budgets, or the problem files of a directory."""
    if args.problems:  # problem files, or every stage of the schedule rule's schedules.json files under DIR
        out = []
        for path in sorted(Path(args.problems).rglob("*.json")):
            stages = read_json(path).get("stages")
            for i in range(len(stages)) if stages else [None]:
                label = path.stem if i is None else f"{path.parent.relative_to(args.problems)} stage {i}"
                out.append((label, load_problem(path, stage=i)))
        return out
    out = []
    for n in args.sizes:
        p = training_graph(n, args.seed, bandwidth=args.bandwidth)
        peak = replay(p, no_recompute_events(p)).peak_bytes
        for frac in FRACTIONS:
            out.append((f"n={p.n} {frac:.0%} peak", p.with_budget(int(frac * peak))))
        out.append((f"n={p.n} 1.1 floor", p.with_budget(int(1.1 * p.floor_bytes))))
    return out


def row(label: str, problem: Problem, name: str, s) -> str:
    base = problem.compute_time
    ours = name.startswith("ours")
    first = s.extra.get("first_feasible_seconds") if ours else (s.solve_seconds if s.ok else None)
    cells = [
        label, name, s.status,
        "-" if first is None else f"{first:.2f}",
        "-" if s.time is None else f"{s.time:.4f}",
        "-" if s.time is None else f"{100 * (s.time / base - 1):.2f}%",
        "-" if s.gap is None else f"{100 * s.gap:.2f}%",
        "-" if s.bound is None else f"{s.bound:.4f}",
        "-" if s.peak_bytes is None else f"{s.peak_bytes / problem.budget_bytes:.3f}",
        f"{s.solve_seconds:.1f}",
        s.extra.get("note", s.extra.get("milp_status", "")) if not ours else
        f"{s.extra.get('heuristic')}; mip {s.extra.get('mip', {}).get('status')}",
    ]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 250, 500, 1000, 2000])
    ap.add_argument("--time-limit", type=float, default=10.0, help="per solver call, seconds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bandwidth", type=float, default=1.6e10, help="host link of the synthetic graphs, bytes/s")
    ap.add_argument("--problems", help="directory of problem JSON files (benched at their own budget)")
    ap.add_argument("--methods", nargs="+", default=[*METHODS, RC_ONLY], choices=[*METHODS, RC_ONLY])
    ap.add_argument("--deterministic", action="store_true",
                    help="single-worker deterministic-time CP-SAT (reproducible unless the wall-clock "
                         "safety cap stops it)")
    args = ap.parse_args(argv)
    print(f"# bench_schedule: time limit {args.time_limit:g} s, {args.workers} workers, seed {args.seed}, "
          f"host link {args.bandwidth:.3g} B/s (synthetic graphs), "
          f"{'deterministic' if args.deterministic else 'wall-clock'} CP-SAT")
    print("| case | method | status | first feasible s | time s | overhead vs no-recompute time | gap | bound s "
          "| peak/budget | solve s | notes |")
    print("|" + "---|" * 11)
    for label, problem in cases(args):
        t0 = time.perf_counter()
        results = compare(problem, args.time_limit, args.workers, args.seed,
                          SolveOptions(bisect=False, deterministic=args.deterministic))
        if RC_ONLY in args.methods:
            rc_only = Problem(tuple(replace(op, swap=False) for op in problem.ops), problem.budget_bytes,
                              problem.bandwidth, problem.fixed_bytes, problem.keep)
            results[RC_ONLY] = solve(rc_only, args.time_limit, args.workers, args.seed,
                                     options=SolveOptions(bisect=False, deterministic=args.deterministic))
        for name in args.methods:
            print(row(label, problem, name, results[name]), flush=True)
        print(f"<!-- {label}: {time.perf_counter() - t0:.1f} s -->", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
