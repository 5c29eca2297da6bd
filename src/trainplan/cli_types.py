"""Argument types shared by the subcommands: numbers checked at parse time, so a bad option is an argparse
error naming the option, not a solver fault later."""

from __future__ import annotations

import argparse

from trainplan.budget import Budget, BudgetError, parse_budget


def positive_float(text: str) -> float:
    """A finite number > 0 (time limits)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (worker counts)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """An integer >= 0 (byte budgets, stage indices)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def budget(text: str) -> Budget:
    """A memory budget (:mod:`trainplan.budget`): bytes with a unit (``2GiB``), plain bytes, or a fraction in
    (0, 1] of the no-recompute peak."""
    try:
        return parse_budget(text)
    except BudgetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
