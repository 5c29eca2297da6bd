"""``trainplan layout PROBLEM.json -o PLAN.json``: plan per-node layouts of a documented problem file."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from trainplan.cli_types import nonnegative_int, positive_float, positive_int
from trainplan.io import write_json


def add_parser(sub: argparse._SubParsersAction) -> Callable[[argparse.Namespace], int]:
    """Register the ``layout`` subcommand; returns its runner."""
    from trainplan.layout.solve import METHODS

    ap = sub.add_parser("layout", help="per-layer data layouts minimising time including transforms")
    ap.add_argument("problem", help="layout problem JSON (see docs/layout.md)")
    ap.add_argument("-o", "--output", required=True, help="plan JSON to write")
    ap.add_argument("--method", default="exact", help=f"one of {', '.join(METHODS)}, all_<layout>, or 'all' "
                    "(exact plan with every baseline under 'baselines')")
    ap.add_argument("--time-limit", type=positive_float, default=10.0, help="seconds for CP-SAT / backtracking")
    ap.add_argument("--workers", type=positive_int, default=2)
    ap.add_argument("--seed", type=nonnegative_int, default=0)
    return run


def run(args: argparse.Namespace) -> int:
    """Load, solve, write the plan; a bad problem raises LayoutProblemError before anything is written."""
    from trainplan.layout import load_problem, solve, solve_all

    problem = load_problem(args.problem)
    if args.method == "all":
        plan = solve_all(problem, args.time_limit, args.workers, args.seed)
    else:
        plan = solve(problem, args.method, args.time_limit, args.workers, args.seed)
    write_json(args.output, plan.to_dict())
    print(f"{args.output}: {plan.method} {plan.status} time={plan.time:.6g} bound={plan.bound:.6g} "
          f"({plan.solve_time_s:.3f} s)")
    return 0
