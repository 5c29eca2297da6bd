"""A frontier method's name: ``kind`` or ``kind@value`` (the kinds: :mod:`trainplan.frontier.methods`), parsed
and checked without torch (the frontier's plot reads names only)."""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.budget import parse_budget

#: kinds taking a value after ``@``, and those without
VALUED = ("compile", "compile+exact", "trainplan", "trainplan+opt", "trainplan+cce", "trainplan+opt+cce",
          "trainplan+fused", "trainplan+opt+fused", "sac", "sac+compile")
PLAIN = ("eager", "hf_checkpointing")
#: kinds that are trainplan's (a plan, an export of one, or our solver inside torch.compile)
OURS = ("trainplan", "trainplan+opt", "trainplan+cce", "trainplan+opt+cce", "trainplan+fused", "trainplan+opt+fused",
        "compile+exact", "sac", "sac+compile")


class MethodError(ValueError):
    """A method name that is not one of the kinds, or a value it cannot take; the message names it."""


@dataclass(frozen=True)
class Method:
    kind: str
    value: str = ""

    @classmethod
    def parse(cls, text: str) -> Method:
        kind, _, value = text.partition("@")
        if kind in PLAIN and not value:
            return cls(kind)
        if kind not in VALUED or not value:
            raise MethodError(f"method {text!r}: expected one of {', '.join(PLAIN)} or <kind>@<value> with kind in "
                              f"{', '.join(VALUED)}")
        if kind.startswith("compile"):
            try:
                budget = float(value)
            except ValueError:
                budget = -1.0
            if not 0 <= budget <= 1:
                raise MethodError(f"method {text!r}: activation_memory_budget must be a number in [0, 1]")
        else:
            parse_budget(value)  # a fraction ('0.5') or bytes ('2GiB'); BudgetError names the value
        return cls(kind, value)

    def __str__(self) -> str:
        return f"{self.kind}@{self.value}" if self.value else self.kind

    @property
    def ours(self) -> bool:
        return self.kind in OURS

    @property
    def optimizer_in_plan(self) -> bool:
        """The plan updates each parameter in backward and holds the optimizer's state (``+opt``): its budget
        covers the whole step; any other plan's covers forward and backward."""
        return "+opt" in self.kind
