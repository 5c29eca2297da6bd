"""Recompute/swap scheduling of one pipeline stage under a device-memory cap.

Public API: :func:`problem_from_dict`, :func:`load_problem`, :func:`replay`,
:func:`solve`, :func:`compare`, :class:`SolveOptions`, :class:`Problem`, :class:`Schedule`.
"""

from trainplan.schedule.problem import Op, Problem, ProblemError, load_problem, problem_from_dict
from trainplan.schedule.replay import Replay, ScheduleError, replay
from trainplan.schedule.schedule_io import Schedule, save_schedule
from trainplan.schedule.solve import METHODS, SolveOptions, compare, solve

__all__ = [
    "METHODS",
    "Op",
    "Problem",
    "ProblemError",
    "Replay",
    "Schedule",
    "ScheduleError",
    "SolveOptions",
    "compare",
    "load_problem",
    "problem_from_dict",
    "replay",
    "save_schedule",
    "solve",
]
