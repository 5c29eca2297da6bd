"""Entry points: :func:`solve` (one method) and :func:`compare` (every method at one budget). Method "ours" is the
portfolio of ``schedule/portfolio.py``: heuristics give a first schedule at once, bounds and CP-SAT improve and bound
it, a bisection raises a budget no schedule meets."""

from __future__ import annotations

from typing import Any

from trainplan.schedule import baselines
from trainplan.schedule import deadline as dl
from trainplan.schedule.checkmate import checkmate
from trainplan.schedule.context import RunOptions
from trainplan.schedule.portfolio import run_portfolio, top_context
from trainplan.schedule.problem import Problem
from trainplan.schedule.schedule_io import Schedule
from trainplan.schedule.settings import DEFAULTS, PortfolioSettings

METHODS = ("ours", "no_recompute", "sqrt_checkpoint", "checkmate", "swap_only")


def solve(problem: Problem, time_limit_s: float = 10.0, workers: int = 2, seed: int = 0, *,
          method: str = "ours", budget_bytes: int | None = None, bisect: bool = True,
          deterministic: bool = True, copies: int | None = None, verbose: bool = False,
          settings: PortfolioSettings = DEFAULTS) -> Schedule:
    """Schedule ``problem`` at ``budget_bytes`` (default: the problem's) with one method, within ``time_limit_s``.

    For "ours", an infeasible budget triggers a bisection from the memory floor to the no-recompute
    peak (probes: greedy, then a short CP-SAT run); the schedule then records ``budget_bytes`` (the
    smallest feasible budget found), ``requested_budget_bytes`` and a note. The whole call, bisection
    included, shares ``time_limit_s`` (the limit of this method: another method gets its own, as in the workflow):
    every step stops by ``settings.deadline_share`` of it (see docs/schedule.md, "Time limit"). ``extra["strategies"]`` lists the portfolio's strategies, ran or skipped and
    why (see :func:`trainplan.schedule.portfolio.explain`).
    """
    if budget_bytes is not None:
        problem = problem.with_budget(budget_bytes)
    with dl.scope(dl.Deadline.after(settings.deadline_share * time_limit_s)):
        if method != "ours":
            return _baseline(problem, method, time_limit_s, workers, seed)
        run = RunOptions(workers, seed, deterministic, copies, verbose, bisect, settings)
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
            **kwargs: Any) -> dict[str, Schedule]:
    """Every method on the same problem and budget, keyed by method name, each within ``time_limit_s``: the limit is
    per method, as in the workflow's schedule rule and ``trainplan schedule --method all``. ``kwargs`` go to ours
    (:func:`solve`); ours does not bisect unless ``bisect=True`` (the baselines never do)."""
    budget = kwargs.get("budget_bytes")
    out = {"ours": solve(problem, time_limit_s, workers, seed, **{"bisect": False, **kwargs})}
    for method in METHODS[1:]:
        out[method] = solve(problem, time_limit_s, workers, seed, method=method, budget_bytes=budget)
    return out
