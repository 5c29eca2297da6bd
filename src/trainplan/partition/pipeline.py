"""Pipeline metrics from per-stage scheduled times: balance rates, GPipe step time, each rank's peak memory."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from trainplan.schedule.pipeline_hold import held_beside, in_flight

FORMULAS = {
    "rate": "t_min / t_max over the stages' scheduled times",
    "spread": "(t_max - t_min) / t_max",
    "gpipe_step_time_s": "(m + k - 1) * t_max for m micro-batches",
    "rank_peak_bytes": "stage s (0-based): schedule peak_bytes + gradient_sum_bytes (m > 1) + carrier_bytes + "
                       "(in_flight[s] - 1) * stash_bytes, in_flight[s] = min(k - s, m) under 1F1B, m under GPipe "
                       "-- the running micro-batch under its schedule (each "
                       "gradient counted while it is made, then added into its sum), the "
                       "gradients summed across micro-batches, the carriers held, and what the schedule holds at "
                       "its split for each other micro-batch in flight, whose backward has not run yet "
                       "(trainplan.schedule.pipeline_hold)",
}


@dataclass(frozen=True)
class PipelineMetrics:
    t_max_s: float
    t_min_s: float
    rate: float
    spread: float
    bottleneck_stage: int
    gpipe_step_time_s: float
    rank_peak_bytes: list[int]
    schedule: str
    in_flight: list[int]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pipeline_metrics(times: list[float], peaks: list[int], stash_bytes: list[int], micro_batches: int,
                     gradient_sum_bytes: list[int] | None = None,
                     carrier_bytes: list[int] | None = None, schedule: str = "1f1b",
                     stages_per_rank: int = 1) -> PipelineMetrics:
    """Metrics of k stages with scheduled ``times`` (s), schedule ``peaks``, the bytes each schedule holds at its
    split, the gradients each stage sums across micro-batches and the carriers it holds, run with ``schedule``'s
    in-flight micro-batches, ``stages_per_rank`` stages per rank (see FORMULAS)."""
    k = len(times)
    n = [in_flight(s, k, micro_batches, schedule, stages_per_rank) for s in range(k)]
    sums = gradient_sum_bytes or [0] * k
    carriers = carrier_bytes or [0] * k
    t_max, t_min = max(times), min(times)
    rate = t_min / t_max if t_max > 0 else 1.0
    return PipelineMetrics(
        t_max_s=t_max,
        t_min_s=t_min,
        rate=rate,
        spread=1.0 - rate,
        bottleneck_stage=times.index(t_max),
        gpipe_step_time_s=(micro_batches + k - 1) * t_max,
        rank_peak_bytes=[int(p + held_beside(g if micro_batches > 1 else 0, c, i, a))
                         for p, a, g, c, i in zip(peaks, stash_bytes, sums, carriers, n)],
        schedule=schedule,
        in_flight=n,
    )
