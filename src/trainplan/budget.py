"""Memory budgets: bytes (``"2GiB"``, ``"1500MB"``, ``"512KiB"``, an int) or a fraction of a stage's
no-recompute peak (a float in (0, 1]), parsed in one place for the API, the CLI and the planners.

A fraction means what the workflow's ``budgets`` mean: the stage's fixed bytes (parameters, buffers and
inputs it reads) plus that fraction of its no-recompute peak above them
(:func:`trainplan.schedule.stage_problem.budget_for` turns a budget into bytes).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

#: byte units, matched case-insensitively: SI (powers of 1000) and IEC (powers of 1024)
UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_TEXT = re.compile(r"(-?)(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)", re.IGNORECASE)
_HINT = "bytes ('2GiB', '1500MB', '512KiB', an integer) or a fraction in (0, 1] of the no-recompute peak ('0.5')"


class BudgetError(ValueError):
    """A budget that is neither bytes nor a fraction in (0, 1]; the message names the value."""


@dataclass(frozen=True)
class Budget:
    """A memory budget: ``bytes`` (an exact byte count) or ``fraction`` (of the no-recompute peak); one is set."""

    bytes: int | None = None
    fraction: float | None = None

    def __str__(self) -> str:
        return f"{self.bytes} B" if self.bytes is not None else f"{self.fraction:g} of the no-recompute peak"


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


def _fraction(number: float, value: object) -> Budget:
    if not (math.isfinite(number) and 0 < number <= 1):
        raise BudgetError(f"budget {value!r}: a fraction must be in (0, 1]; give bytes with a unit ('2GiB') instead")
    return Budget(fraction=number)


def format_bytes(n: int | float) -> str:
    """``n`` bytes in the largest IEC unit that keeps it at 1 or more (``1.50 GiB``, ``512 B``)."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if abs(n) >= UNITS[unit.lower()]:
            return f"{n / UNITS[unit.lower()]:.2f} {unit}"
    return f"{int(n)} B"
