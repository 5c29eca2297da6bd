"""Which layout plan the stage hands to the user: the exact plan only where its measured step beat the fastest
single layout beyond noise, confirmed on fresh timing rounds (the selection's own rounds would flatter it)."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from trainplan.stats import paired_speedup_ci


@dataclass(frozen=True)
class Adoption:
    """The adopted config, why, and its speedup over the fastest single layout on rounds not used to choose it
    (``samples_s``: those rounds, per config; empty when the adopted config is that single layout itself)."""

    config: str
    reason: str
    speedup_vs_best_single: float
    ci95: tuple[float, float]
    samples_s: dict[str, list[float]]

    def to_dict(self) -> dict[str, object]:
        low, high = self.ci95
        return {"config": self.config, "reason": self.reason, "speedup_vs_best_single": self.speedup_vs_best_single,
                "speedup_vs_best_single_ci95": [low, high], "slower_than_best_single": high < 1.0,
                "faster_than_best_single": low > 1.0, "confirmation_samples_s": self.samples_s}


def choose(selection_ci: tuple[float, float], fastest_single: str, gradients_ok: bool = True) -> tuple[str, str]:
    """(config, reason): ``planned`` when the selection rounds put its whole 95% interval of speedup over the
    fastest single layout above 1 and its gradients passed the check, else that single layout."""
    low, high = selection_ci
    if not gradients_ok:
        return fastest_single, (f"the exact plan failed its gradient check (95% interval of its speedup "
                                f"{low:.3f}-{high:.3f}): the fastest single layout is kept")
    if low > 1.0:
        return "planned", f"the exact plan measured faster than {fastest_single} beyond noise (95% interval {low:.3f}-{high:.3f})"
    return fastest_single, (f"the exact plan was not faster than {fastest_single} beyond noise (95% interval "
                            f"{low:.3f}-{high:.3f}): the fastest single layout is kept")


def confirm(config: str, reason: str, fastest_single: str, samples: dict[str, list[float]], seed: int) -> Adoption:
    """The adoption with its speedup over ``fastest_single`` on fresh paired rounds ``samples`` (``config`` and
    ``fastest_single`` each timed once per round); a single layout adopted as itself is exactly 1."""
    if config == fastest_single:
        return Adoption(config, reason, 1.0, (1.0, 1.0), {})
    base, new = samples[fastest_single], samples[config]
    ci = paired_speedup_ci(base, new, seed)
    return Adoption(config, reason, median(base) / median(new), ci, {fastest_single: base, config: new})

