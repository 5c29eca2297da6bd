"""Command-line entry point: ``trainplan <subcommand> ...``; subcommands register in SUBCOMMANDS."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainplan.align.cli import add_parser as add_align_parser
from trainplan.cli_types import budget, nonnegative_int, positive_float, positive_int
from trainplan.fuse.cli import add_parser as add_fuse_parser
from trainplan.layout.cli import add_parser as add_layout_parser
from trainplan.pipeline.cli import add_parser as add_pipeline_run
from trainplan.provenance.cli import add_parser as add_publish
from trainplan.provenance.cli import add_verify_parser as add_verify

if TYPE_CHECKING:
    from trainplan.schedule.problem import Problem


def _add_schedule(sub: argparse._SubParsersAction) -> Callable[[argparse.Namespace], int]:
    from trainplan.schedule.solve import METHODS

    ap = sub.add_parser("schedule", help="recompute/swap schedule of one stage under a memory budget")
    ap.add_argument("problem", help="problem JSON (see docs/schedule.md)")
    out = ap.add_mutually_exclusive_group(required=True)
    out.add_argument("-o", "--output", help="schedule JSON to write")
    out.add_argument("--explain", action="store_true",
                     help="print which strategies of method 'ours' will run on PROBLEM and why, without solving")
    ap.add_argument("--time-limit", type=positive_float, default=10.0,
                    help="seconds per method, bisection included (as solver.time_limit_s in the workflow): one method "
                         "returns within it; 'all' gives ours and each baseline this limit")
    ap.add_argument("--workers", type=positive_int, default=2)
    ap.add_argument("--seed", type=nonnegative_int, default=0)
    ap.add_argument("--method", choices=[*METHODS, "all"], default="ours",
                    help="'all' writes ours (as --method ours) with every baseline at the budget under the key "
                         "'baselines', as the workflow's schedule rule")
    ap.add_argument("--nondeterministic", action="store_true",
                    help="stop CP-SAT on wall time with the parallel portfolio (faster, not reproducible)")
    ap.add_argument("--budget", type=budget, default=None,
                    help="override the problem's budget_bytes: bytes (2GiB, 1500MB, 512KiB, 1048576) or a fraction in "
                         "(0, 1] of the problem's no-recompute peak above its fixed bytes (0.5)")
    ap.add_argument("--stage", type=nonnegative_int, default=None,
                    help="PROBLEM is a schedules.json of the schedule rule: solve this stage's problem")
    ap.add_argument("-v", "--verbose", action="store_true", help="log CP-SAT search progress")
    return _run_schedule


def _schedule_problem(args: argparse.Namespace) -> Problem:
    from trainplan.schedule import load_problem
    from trainplan.schedule.stage_problem import budget_for

    problem = load_problem(args.problem, stage=args.stage)
    return problem if args.budget is None else problem.with_budget(budget_for(problem.to_dict(), args.budget))


def _run_schedule(args: argparse.Namespace) -> int:
    from trainplan.schedule import METHODS, SolveOptions, compare, save_schedule, solve
    from trainplan.schedule import deadline as dl
    from trainplan.schedule.context import RunOptions
    from trainplan.schedule.portfolio import explanation_text

    if args.explain:
        run = RunOptions(args.workers, args.seed, deterministic=not args.nondeterministic)
        print(explanation_text(_schedule_problem(args), args.time_limit, run))
        return 0
    # one deadline scope from reading the problem to writing the schedule: the limit (one per method) counts from
    # the start, and the garbage collector stays frozen until the file is written (the full collection due when the
    # solver's own scope ends scans every object it had frozen: past a short limit)
    methods = len(METHODS) if args.method == "all" else 1
    with dl.scope(dl.Deadline.after(methods * args.time_limit)):
        problem = _schedule_problem(args)
        opts = SolveOptions(deterministic=not args.nondeterministic, verbose=args.verbose)
        if args.method == "all":  # as the workflow's schedule rule: ours bisects, the baselines at the budget
            results = compare(problem, args.time_limit, args.workers, args.seed, opts)
            sched = results.pop("ours")
            sched.extra["baselines"] = {name: s.to_dict() for name, s in results.items()}
        elif args.method == "ours":
            sched = solve(problem, args.time_limit, args.workers, args.seed, options=opts)
        else:
            sched = solve(problem, args.time_limit, args.workers, args.seed, method=args.method)
        save_schedule(args.output, sched)
    gap = "-" if sched.gap is None else f"{sched.gap:.2%}"
    requested = sched.extra.get("requested_budget_bytes")
    raised = "" if requested is None else f" (raised from {requested}: {sched.extra.get('budget_status')})"
    print(f"{args.output}: {sched.method} {sched.status} time={sched.time} peak={sched.peak_bytes} "
          f"budget={sched.budget_bytes}{raised} gap={gap}")
    return 0


SUBCOMMANDS: dict[str, Callable[[argparse._SubParsersAction], Callable[[argparse.Namespace], int]]] = {
    "schedule": _add_schedule,
    "fuse": add_fuse_parser,
    "align": add_align_parser,
    "layout": add_layout_parser,
    "pipeline-run": add_pipeline_run,
    "publish": add_publish,
    "verify": add_verify,
}


def _input_errors() -> tuple[type[Exception], ...]:
    """The bad-input errors of every subcommand, imported when needed (``align``'s pulls in torch)."""
    from trainplan.align.units import AlignError
    from trainplan.fuse.errors import FuseError
    from trainplan.errors import ArtifactError
    from trainplan.execute.plan import PlanError
    from trainplan.models import ModelSpecError
    from trainplan.pipeline.errors import PipelineError
    from trainplan.schedule.problem import ProblemError

    return ArtifactError, ProblemError, AlignError, FuseError, PlanError, PipelineError, ModelSpecError


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``; bad input files print one line naming the file/op/key and exit 2."""
    parser = argparse.ArgumentParser(prog="trainplan", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    runners = {name: add(sub) for name, add in SUBCOMMANDS.items()}
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return runners[args.command](args)
    except _input_errors() as exc:  # evaluated only when an exception propagates
        print(f"trainplan {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
