"""The step time a schedule gives from measured stage costs: each rank runs its actions in the schedule's own
order (as ``torch.distributed.pipelining``'s schedule ran them), each action starting when its rank is free and its
input has arrived. The costs are measured in the same run: one micro-batch's forward and backward per stage
with no other stage computing, and one carrier's transfer per link and direction.

Transfer model (checked on gloo timelines): the sender pays a transfer right after the action that made the
carrier (its next action starts after it), and the receiver's action starts no earlier than the sender's action
end plus the transfer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainplan.pipeline.errors import PipelineError

FORMULA = ("each rank runs the schedule's compute actions in the order they ran; F(s, i) starts at max(rank s free, "
           "end of F(s-1, i) + forward transfer s-1 -> s); B(s, i) at max(rank s free, end of B(s+1, i) + backward "
           "transfer s+1 -> s), the last stage's after its own F(s, i); the sender is busy for the transfer after "
           "the action; step = the latest rank's end; costs measured in the same run (stage alone, one micro-batch)")


@dataclass(frozen=True)
class StageCosts:
    """Seconds of one micro-batch: per stage its forward and backward; per link s -> s+1 one forward carrier
    (``forward_transfer_s[s]``) and one gradient carrier back (``backward_transfer_s[s]``)."""

    forward_s: list[float]
    backward_s: list[float]
    forward_transfer_s: list[float]
    backward_transfer_s: list[float]

    def __post_init__(self) -> None:
        k = len(self.forward_s)
        if len(self.backward_s) != k or len(self.forward_transfer_s) != k - 1 or len(self.backward_transfer_s) != k - 1:
            raise PipelineError(f"stage costs for k={k} stages need k forward/backward times and k - 1 transfers "
                                f"per direction, got {len(self.backward_s)}, {len(self.forward_transfer_s)}, "
                                f"{len(self.backward_transfer_s)}")


Order = list[list[tuple[str, int]]]  # per rank: (kind F|B, micro-batch) in the order the rank runs them


def recorded_orders(timeline: list[list[dict[str, Any]]]) -> Order:
    """Each rank's compute calls, (F|B, micro-batch), in the order they ran in a measured step (the schedule's
    ``_step_microbatches``; its ``pipeline_order`` IR is not used: in torch 2.13 Schedule1F1B's IR numbers the last
    rank's forwards from 1, unlike what the schedule runs)."""
    return [[(a["kind"], int(a["micro_batch"])) for a in actions] for actions in timeline]


def simulate(orders: Order, costs: StageCosts) -> dict[str, Any]:
    """The step time and each rank's actions (start/end seconds) under the transfer model above; raises
    PipelineError if the orders deadlock (an action waiting for one that never runs)."""
    k = len(orders)
    if k != len(costs.forward_s):
        raise PipelineError(f"{k} rank orders for {len(costs.forward_s)} stage costs")
    end: dict[tuple[str, int, int], float] = {}
    free = [0.0] * k
    position = [0] * k
    timeline: list[list[dict[str, Any]]] = [[] for _ in range(k)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(k):
            while position[s] < len(orders[s]):
                kind, i = orders[s][position[s]]
                ready = _ready(kind, s, i, k, end, costs)
                if ready is None:
                    break
                start = max(free[s], ready)
                finish = start + (costs.forward_s[s] if kind == "F" else costs.backward_s[s])
                end[(kind, s, i)] = finish
                free[s] = finish + _sent(kind, s, k, costs)
                timeline[s].append({"kind": kind, "micro_batch": i, "start_s": start, "end_s": finish})
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            waiting = [orders[s][position[s]] for s in range(k) if position[s] < len(orders[s])]
            raise PipelineError(f"the schedule's orders deadlock: next actions {waiting} wait for each other")
    return {"step_time_s": max(free), "rank_end_s": free, "timeline": timeline}


def _ready(kind: str, s: int, i: int, k: int, end: dict[tuple[str, int, int], float],
           costs: StageCosts) -> float | None:
    """When action (kind, i) of stage s may start as far as its input goes, or None if that input is not made yet."""
    if kind == "F":
        if s == 0:
            return 0.0
        made = end.get(("F", s - 1, i))
        return None if made is None else made + costs.forward_transfer_s[s - 1]
    own = end.get(("F", s, i))
    if own is None:
        return None
    if s == k - 1:
        return own
    made = end.get(("B", s + 1, i))
    return None if made is None else max(own, made + costs.backward_transfer_s[s])


def _sent(kind: str, s: int, k: int, costs: StageCosts) -> float:
    """The transfer the sender pays after an action: a forward sends to s + 1, a backward to s - 1."""
    if kind == "F":
        return costs.forward_transfer_s[s] if s < k - 1 else 0.0
    return costs.backward_transfer_s[s - 1] if s > 0 else 0.0
