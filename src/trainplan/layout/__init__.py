"""Global conv data-layout planning (seed 004, MACO): measure, predict, plan exactly, execute, I/O bounds."""

from trainplan.layout.problem import LayoutProblem, LayoutProblemError, load_problem, problem_from_dict
from trainplan.layout.solve import METHODS, Plan, plan_time, solve, solve_all

__all__ = [
    "LayoutProblem", "LayoutProblemError", "load_problem", "problem_from_dict",
    "METHODS", "Plan", "plan_time", "solve", "solve_all",
]
