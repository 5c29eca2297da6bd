"""Memory budgets: bytes (``"2GiB"``, ``"1500MB"``, ``"512KiB"``, an int) or a fraction of a stage's
no-recompute peak (a float in (0, 1]), parsed in one place for the API, the CLI and the planners.

A fraction means what the workflow's ``budgets`` mean: the stage's fixed bytes (parameters, buffers and
inputs it reads) plus that fraction of its no-recompute peak above them
(:func:`trainplan.schedule.stage_problem.budget_for` turns a budget into bytes). A byte budget is each stage's
device memory cap: its fixed bytes, inputs and everything it holds included.

The workflow's ``budgets`` entries become the ``{budget}`` wildcard of its paths (``b0.5``, ``b2GiB``) through
:func:`budget_wildcard`, and back into a Budget through :func:`wildcard_budget`; artifacts record a budget as
:meth:`Budget.fields`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

#: byte units, matched case-insensitively: SI (powers of 1000) and IEC (powers of 1024)
UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_TEXT = re.compile(r"(-?)(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)", re.IGNORECASE)
#: spelling of each unit in a wildcard (``2gib`` -> ``2GiB``)
_SPELLING = {unit.lower(): unit for unit in ("B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB")}
#: the keys of :meth:`Budget.fields`
FIELDS = ("budget", "budget_fraction", "requested_budget_bytes")
#: the workflow's ``{budget}`` wildcard: a decimal fraction (``0.5``) or a decimal count of a byte unit (``2GiB``)
WILDCARD = r"[0-9]*\.?[0-9]+(?:(?:[KMGT]i?)?B)?"
_HINT = "bytes ('2GiB', '1500MB', '512KiB', an integer) or a fraction in (0, 1] of the no-recompute peak ('0.5')"


class BudgetError(ValueError):
    """A budget that is neither bytes nor a fraction in (0, 1]; the message names the value."""


@dataclass(frozen=True)
class Budget:
    """A memory budget: ``bytes`` (an exact byte count) or ``fraction`` (of the no-recompute peak); one is set."""

    bytes: int | None = None
    fraction: float | None = None

    def __str__(self) -> str:
        return f"{self.label} of the no-recompute peak" if self.bytes is None else self.label

    @property
    def label(self) -> str:
        """Short text for titles and tables: ``0.5`` (a fraction) or ``2.00 GiB``."""
        return f"{self.fraction:g}" if self.bytes is None else format_bytes(self.bytes)

    def fields(self) -> dict[str, Any]:
        """The budget as plan, schedule and validation files record it: ``budget`` (:attr:`label`),
        ``budget_fraction`` (None for bytes) and ``requested_budget_bytes`` (None for a fraction, whose bytes
        differ by stage: each stage's problem has them)."""
        return dict(zip(FIELDS, (self.label, self.fraction, self.bytes)))

    @classmethod
    def of_fields(cls, fields: Mapping[str, Any]) -> Budget:
        """The budget a file's :meth:`fields` record."""
        return cls(bytes=fields.get("requested_budget_bytes"), fraction=fields.get("budget_fraction"))


def parse_budget(value: Budget | str | int | float) -> Budget:
    """A budget from a string with a byte unit (``"2GiB"``; a decimal count of units is rounded down to whole
    bytes), a string or int of bytes (``"1500"``, ``1500``), or a float or decimal string fraction in (0, 1]
    (``0.5``, ``"0.5"``). Anything else raises BudgetError naming the value."""
    if isinstance(value, Budget):
        return value
    if isinstance(value, bool):
        raise BudgetError(f"budget {value!r}: expected {_HINT}")
    if isinstance(value, int):
        if value < 0:
            raise BudgetError(f"budget {value!r}: a byte count must be >= 0")
        return Budget(bytes=value)
    if isinstance(value, float):
        return _fraction(value, value)
    if not isinstance(value, str):
        raise BudgetError(f"budget {value!r} ({type(value).__name__}): expected {_HINT}")
    found = _TEXT.fullmatch(value.strip())
    if found is None:
        raise BudgetError(f"budget {value!r}: expected {_HINT}")
    sign, number, unit = found.groups()
    if unit and unit.lower() not in UNITS:
        raise BudgetError(f"budget {value!r}: unknown unit {unit!r}; use one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB")
    if not unit and "." in number:
        return _fraction(float(sign + number), value)
    if sign:
        raise BudgetError(f"budget {value!r}: a byte count must be >= 0")
    return Budget(bytes=int(Fraction(number) * UNITS[(unit or "b").lower()]))


def parse_bytes(value: str | int, what: str) -> int:
    """A byte count > 0 (``"64MiB"``, ``4096``) for the setting ``what``; a fraction, zero or anything else raises
    BudgetError naming it."""
    try:
        budget = parse_budget(value)
    except BudgetError as exc:
        raise BudgetError(f"{what}: {exc}") from exc
    if not budget.bytes:
        raise BudgetError(f"{what}={value!r}: give bytes > 0 ('64MiB', an integer), not a fraction")
    return budget.bytes


def _fraction(number: float, value: object) -> Budget:
    if not (math.isfinite(number) and 0 < number <= 1):
        raise BudgetError(f"budget {value!r}: a fraction must be in (0, 1]; give bytes with a unit ('2GiB') instead")
    return Budget(fraction=number)


def budget_wildcard(entry: str | int | float) -> str:
    """The ``{budget}`` wildcard of a workflow ``budgets`` entry: a number is a fraction in (0, 1], written as given
    (``0.5`` -> ``0.5``); a string is bytes with a unit, its unit spelled one way and its number without
    surplus zeros (``"2 gib"`` -> ``2GiB``, ``"1500MB"`` -> ``1500MB``). Raises BudgetError naming the entry."""
    if isinstance(entry, (int, float)) and not isinstance(entry, bool):
        _fraction(float(entry), entry)
        return format(Decimal(repr(entry)), "f")
    found = _TEXT.fullmatch(entry.strip()) if isinstance(entry, str) else None
    if found is None or not found.group(3):
        raise BudgetError(f"budget {entry!r}: expected a fraction in (0, 1] (a number, 0.5) or bytes with a unit "
                          "('2GiB', '1500MB')")
    parse_budget(entry)
    return format(Decimal(found.group(2)).normalize(), "f") + _SPELLING[found.group(3).lower()]


def wildcard_budget(text: str) -> Budget:
    """The budget of a ``{budget}`` wildcard (:func:`budget_wildcard`): bytes where it has a unit, else a fraction."""
    if re.fullmatch(WILDCARD, text) is None:
        raise BudgetError(f"budget wildcard {text!r}: expected a fraction ('0.5') or bytes with a unit ('2GiB')")
    return parse_budget(text if text[-1] == "B" else float(text))


def format_bytes(n: int | float) -> str:
    """``n`` bytes in the largest IEC unit that keeps it at 1 or more (``1.50 GiB``, ``512 B``)."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if abs(n) >= UNITS[unit.lower()]:
            return f"{n / UNITS[unit.lower()]:.2f} {unit}"
    return f"{int(n)} B"
