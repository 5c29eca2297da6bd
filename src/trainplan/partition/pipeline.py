"""Pipeline metrics from per-stage scheduled times: balance rates, GPipe step time, 1F1B peak memory."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from trainplan.partition.memory_limit import in_flight

FORMULAS = {
    "rate": "t_min / t_max over the stages' scheduled times",
    "spread": "(t_max - t_min) / t_max",
    "gpipe_step_time_s": "(m + k - 1) * t_max for m micro-batches",
    "peak_1f1b_bytes": "stage s (0-based): schedule peak_bytes + (min(k - s, m) - 1) * activation_bytes -- "
                       "the running micro-batch under its schedule plus the stashed activations of the "
                       "others in flight, whose backward has not run yet",
}


@dataclass(frozen=True)
class PipelineMetrics:
    t_max_s: float
    t_min_s: float
    rate: float
    spread: float
    bottleneck_stage: int
    gpipe_step_time_s: float
    peak_1f1b_bytes: list[int]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pipeline_metrics(times: list[float], peaks: list[int], activation_bytes: list[int],
                     micro_batches: int) -> PipelineMetrics:
    """Metrics of k stages with scheduled ``times`` (s), schedule ``peaks`` and stash bytes (see FORMULAS)."""
    k = len(times)
    t_max, t_min = max(times), min(times)
    rate = t_min / t_max if t_max > 0 else 1.0
    return PipelineMetrics(
        t_max_s=t_max,
        t_min_s=t_min,
        rate=rate,
        spread=1.0 - rate,
        bottleneck_stage=times.index(t_max),
        gpipe_step_time_s=(micro_batches + k - 1) * t_max,
        peak_1f1b_bytes=[int(p + (in_flight(s, k, micro_batches) - 1) * a)
                         for s, (p, a) in enumerate(zip(peaks, activation_bytes))],
    )
