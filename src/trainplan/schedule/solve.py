"""Entry points: :func:`solve` (one method) and :func:`compare` (every method at one budget). Method "ours" is the
portfolio of ``schedule/portfolio.py``: heuristics give a first schedule at once, bounds and CP-SAT improve and bound
it, a bisection raises a budget no schedule meets."""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.schedule import baselines
from trainplan.schedule import deadline as dl
from trainplan.schedule.checkmate import checkmate
from trainplan.schedule.context import RunOptions
from trainplan.schedule.portfolio import run_portfolio, top_context
from trainplan.schedule.problem import Problem
from trainplan.schedule.schedule_io import Schedule
from trainplan.schedule.settings import DEFAULTS, PortfolioSettings

METHODS = ("ours", "no_recompute", "sqrt_checkpoint", "checkmate", "swap_only")


@dataclass(frozen=True)
class SolveOptions:
    """How one :func:`solve` runs, beside its limit, workers and seed: at ``budget_bytes`` (default: the problem's);
    for "ours", whether an unmet budget is raised by bisection (``bisect``), on CP-SAT's deterministic time
    (``deterministic``), with CP-SAT's grid of ``copies`` per op (default: by the problem's size) and its search log
    (``verbose``), and the portfolio's tuning (``settings``, ``schedule/settings.py``)."""

    budget_bytes: int | None = None
    bisect: bool = True
    deterministic: bool = True
    copies: int | None = None
    verbose: bool = False
    settings: PortfolioSettings = DEFAULTS


def solve(problem: Problem, time_limit_s: float = 10.0, workers: int = 2, seed: int = 0, *,
          method: str = "ours", options: SolveOptions = SolveOptions()) -> Schedule:
    """Schedule ``problem`` at ``options.budget_bytes`` (default: the problem's) with one method, within
    ``time_limit_s``.

    For "ours", an infeasible budget triggers a bisection (unless ``options.bisect`` is false) from the memory floor
    to the no-recompute peak (probes: greedy, then a short CP-SAT run); the schedule then records ``budget_bytes``
    (the smallest feasible budget found), ``requested_budget_bytes`` and a note. The whole call, bisection
    included, shares ``time_limit_s`` (the limit of this method: another method gets its own, as in the workflow):
    every step stops by ``settings.deadline_share`` of it (see docs/schedule.md, "Time limit"). ``extra["strategies"]``
    lists the portfolio's strategies, ran or skipped and why (see :func:`trainplan.schedule.portfolio.explain`).
    """
    if options.budget_bytes is not None:
        problem = problem.with_budget(options.budget_bytes)
    with dl.scope(dl.Deadline.after(options.settings.deadline_share * time_limit_s)):
        if method != "ours":
            return _baseline(problem, method, time_limit_s, workers, seed)
        run = RunOptions(workers, seed, options.deterministic, options.copies, options.verbose, options.bisect,
                         options.settings)
        return run_portfolio(top_context(problem, time_limit_s, run))


def _baseline(problem: Problem, method: str, time_limit_s: float, workers: int, seed: int) -> Schedule:
    if method == "no_recompute":
        return baselines.no_recompute(problem)
    if method == "sqrt_checkpoint":
        return baselines.sqrt_checkpoint(problem, time_limit_s)
    if method == "swap_only":
        return baselines.swap_only(problem, time_limit_s)
    if method == "checkmate":  # the MILP where it builds in time, else its LP rounding (checkmate decides)
        return checkmate(problem, time_limit_s=min(time_limit_s, dl.current().left()), workers=workers, seed=seed)
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def compare(problem: Problem, time_limit_s: float = 10.0, workers: int = 2, seed: int = 0,
            options: SolveOptions = SolveOptions(bisect=False)) -> dict[str, Schedule]:
    """Every method on the same problem and budget, keyed by method name, each within ``time_limit_s``: the limit is
    per method, as in the workflow's schedule rule and ``trainplan schedule --method all``. ``options`` are ours
    (:func:`solve`); by default ours does not bisect (the baselines never do), and the baselines take only their
    ``budget_bytes``."""
    out = {"ours": solve(problem, time_limit_s, workers, seed, options=options)}
    for method in METHODS[1:]:
        out[method] = solve(problem, time_limit_s, workers, seed, method=method,
                            options=SolveOptions(budget_bytes=options.budget_bytes))
    return out
