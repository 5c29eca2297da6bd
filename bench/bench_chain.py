"""Benchmark on the published checkpointing benchmark: the linear adjoint chain (revolve).

For each chain length l and memory of ``slots`` states, prints the exact optimum of our memory model
(``chain_min_steps``, checked against an independent exact search in the tests), revolve's published
optimum with ``slots - 1`` and ``slots - 2`` snapshots (which bracket it), and what each method
schedules, in forward steps, from replaying its events.

    python bench/bench_chain.py --lengths 10 20 50 100 250 500 --slots 3 4 6 10 --time-limit 10

With ``--heterogeneous SEED`` the chains have random costs (``heterogeneous_chain``, Rotor's setting), the
budget is each ``--floors`` multiple of the memory floor, and no optimum is known: "over best" is the excess
over the best schedule any method found on that row.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from trainplan.schedule import SolveOptions, solve
from trainplan.schedule.chain import adjoint_chain, chain_min_steps, heterogeneous_chain, revolve_min_steps

METHODS = ("ours", "sqrt_checkpoint", "checkmate")


def cells(method: str, sched, optimum: float, digits: int = 0) -> list[str]:
    """Status, time (forward steps on the unit chain), excess over the optimum, gap to the method's own
    bound, times, note."""
    ours = method == "ours"
    first = sched.extra.get("first_feasible_seconds") if ours else (sched.solve_seconds if sched.ok else None)
    steps = sched.time if sched.ok else None
    return [
        method, sched.status,
        "-" if steps is None else f"{steps:.{digits}f}",
        "-" if steps is None else f"{100 * (steps / optimum - 1):.1f}%",
        "-" if sched.gap is None or not sched.ok else f"{100 * sched.gap:.1f}%",
        "-" if first is None else f"{first:.2f}",
        f"{sched.solve_seconds:.1f}",
        "" if ours else sched.extra.get("note", sched.extra.get("milp_status", "")),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[10, 20, 50, 100, 250, 500])
    ap.add_argument("--slots", type=int, nargs="+", default=[3, 4, 6, 10], help="memory, in states (>= 3)")
    ap.add_argument("--time-limit", type=float, default=10.0, help="per solver call, seconds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--deterministic", action="store_true", help="single-worker deterministic-time CP-SAT")
    ap.add_argument("--heterogeneous", type=int, metavar="SEED", help="random-cost chains from this seed")
    ap.add_argument("--floors", type=float, nargs="+", default=[1.1, 1.5, 2.0, 3.0],
                    help="with --heterogeneous: budgets as multiples of the memory floor")
    args = ap.parse_args(argv)
    if args.heterogeneous is not None:
        return heterogeneous(args)
    if min(args.slots) < 3:
        ap.error("--slots must be >= 3 (revolve needs a snapshot besides the input)")
    print(f"# bench_chain: time limit {args.time_limit:g} s, {args.workers} workers, seed {args.seed}, "
          f"{'deterministic' if args.deterministic else 'wall-clock'} CP-SAT; counts are forward steps")
    print("| l | ops | slots | revolve, slots-1 snapshots | optimum | revolve, slots-2 snapshots | method | status "
          "| steps | over optimum | gap to own bound | first feasible s | solve s | notes |")
    print("|" + "---|" * 14)
    for length in args.lengths:
        for slots in args.slots:
            problem = adjoint_chain(length, slots=slots)
            optimum = chain_min_steps(length, slots)
            head = [str(length), str(problem.n), str(slots), str(revolve_min_steps(length, slots - 1)),
                    f"{optimum:.0f}", str(revolve_min_steps(length, slots - 2))]
            for method in args.methods:
                t0 = time.perf_counter()
                sched = solve(problem, args.time_limit, args.workers, args.seed, method=method,
                              options=SolveOptions(bisect=False, deterministic=args.deterministic))
                print("| " + " | ".join(head + cells(method, sched, optimum)) + " |", flush=True)
                print(f"<!-- l={length} slots={slots} {method}: {time.perf_counter() - t0:.1f} s -->",
                      file=sys.stderr)
    return 0


def heterogeneous(args: argparse.Namespace) -> int:
    """The table for random-cost chains: every method, its excess over the best any method found."""
    print(f"# bench_chain --heterogeneous {args.heterogeneous}: time limit {args.time_limit:g} s, {args.workers} "
          f"workers, seed {args.seed}, {'deterministic' if args.deterministic else 'wall-clock'} CP-SAT; "
          "times in seconds of the chain's op times")
    print("| l | ops | budget / floor | method | status | time | over best | gap to own bound | first feasible s "
          "| solve s | notes |")
    print("|" + "---|" * 11)
    for length in args.lengths:
        chain = heterogeneous_chain(length, args.heterogeneous + length)
        for floor in args.floors:
            problem = chain.with_budget(int(floor * chain.floor_bytes))
            scheds = {m: solve(problem, args.time_limit, args.workers, args.seed, method=m,
                               options=SolveOptions(bisect=False, deterministic=args.deterministic))
                      for m in args.methods}
            best = min((s.time for s in scheds.values() if s.ok), default=math.nan)
            for method, sched in scheds.items():
                row = [str(length), str(problem.n), f"{floor:g}"] + cells(method, sched, best, digits=3)
                print("| " + " | ".join(row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
