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
                       "(n - 1 - p') * stash_bytes + p' * max(stash_bytes, carrier_in_bytes) + (p - p') * "
                       "carrier_in_bytes, n = in_flight[s] (min(k - s, m) under 1F1B, m under GPipe), p its pending "
                       "gradient sends, p' = min(p, n - 1) -- the running micro-batch under its schedule (each "
                       "gradient counted while it is made, then added into its sum), the "
                       "gradients summed across micro-batches, the carriers held, and for each other micro-batch "
                       "what the schedule holds at its split until its backward runs, then its gradient carrier "
                       "until its send is waited on (trainplan.schedule.pipeline_hold.others_held)",
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
                     stages_per_rank: int = 1, pending: list[tuple[int, int]] | None = None) -> PipelineMetrics:
    """Metrics of k stages with scheduled ``times`` (s), schedule ``peaks``, the bytes each schedule holds at its
    split, the gradients each stage sums across micro-batches, the carriers it holds and its pending gradient
    sends (count, bytes each), run with ``schedule``'s in-flight micro-batches, ``stages_per_rank`` stages per rank
    (see FORMULAS)."""
    k = len(times)
    n = [in_flight(s, k, micro_batches, schedule, stages_per_rank) for s in range(k)]
    sums = gradient_sum_bytes or [0] * k
    carriers = carrier_bytes or [0] * k
    sends = pending or [(0, 0)] * k
    t_max, t_min = max(times), min(times)
    rate = t_min / t_max if t_max > 0 else 1.0
    return PipelineMetrics(
        t_max_s=t_max,
        t_min_s=t_min,
        rate=rate,
        spread=1.0 - rate,
        bottleneck_stage=times.index(t_max),
        gpipe_step_time_s=(micro_batches + k - 1) * t_max,
        rank_peak_bytes=[int(p + held_beside(g if micro_batches > 1 else 0, c, i, a, *q))
                         for p, a, g, c, i, q in zip(peaks, stash_bytes, sums, carriers, n, sends)],
        schedule=schedule,
        in_flight=n,
    )
