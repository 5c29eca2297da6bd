"""The step time a schedule gives from measured stage costs: each rank runs its actions (a forward or backward of
one of its stages on one micro-batch) in the schedule's own order (as ``torch.distributed.pipelining``'s schedule
ran them), each action starting when its rank is free and its input has arrived. The costs are measured in the
same run: one micro-batch's forward and backward per stage with no other stage computing, and one carrier's
transfer per link and direction.

Transfer model (checked on gloo timelines of one stage per rank): the sender pays a transfer right after the action
that made the carrier (its next action starts after it), and the receiver's action starts no earlier than the
sender's action end plus the transfer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainplan.pipeline.errors import PipelineError

FORMULA = ("each rank runs the schedule's compute actions of its stages in the order they ran; F(s, i) starts at "
           "max(rank of s free, end of F(s-1, i) + forward transfer s-1 -> s); B(s, i) at max(rank of s free, end "
           "of B(s+1, i) + backward transfer s+1 -> s), the last stage's after its own F(s, i); the sender is busy "
           "for the transfer after the action; step = the latest rank's end; costs measured in the same run (stage "
           "alone, one micro-batch)")


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


#: per rank: (kind F|B, stage, micro-batch) in the order the rank runs them
Order = list[list[tuple[str, int, int]]]


def recorded_orders(timeline: list[list[dict[str, Any]]]) -> Order:
    """Each rank's compute calls, (F|B, stage, micro-batch), in the order they ran in a measured step (the
    schedule's ``_step_microbatches``; its ``pipeline_order`` IR is not used: in torch 2.13 Schedule1F1B's IR
    numbers the last rank's forwards from 1, unlike what the schedule runs)."""
    return [[(a["kind"], int(a["stage"]), int(a["micro_batch"])) for a in actions] for actions in timeline]


def held_in_flight(orders: Order, k: int) -> list[int]:
    """Per stage of ``k``, the most micro-batches whose forward ran and whose backward has not, in ``orders``: the
    stashes the stage holds at once."""
    open_, most = [0] * k, [0] * k
    for order in orders:
        for kind, s, _ in order:
            open_[s] += 1 if kind == "F" else -1
            most[s] = max(most[s], open_[s])
    return most


def simulate(orders: Order, costs: StageCosts) -> dict[str, Any]:
    """The step time and each rank's actions (start/end seconds) under the transfer model above; raises
    PipelineError if the orders deadlock (an action waiting for one that never runs) or do not run every stage."""
    k, ranks = len(costs.forward_s), len(orders)
    ran = {s for order in orders for _, s, _ in order}
    if ran != set(range(k)):
        raise PipelineError(f"the rank orders run stages {sorted(ran)}, the costs are for {k} stages")
    end: dict[tuple[str, int, int], float] = {}
    free = [0.0] * ranks
    position = [0] * ranks
    timeline: list[list[dict[str, Any]]] = [[] for _ in range(ranks)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(ranks):
            while position[r] < len(orders[r]):
                kind, s, i = orders[r][position[r]]
                ready = _ready(kind, s, i, k, end, costs)
                if ready is None:
                    break
                start = max(free[r], ready)
                finish = start + (costs.forward_s[s] if kind == "F" else costs.backward_s[s])
                end[(kind, s, i)] = finish
                free[r] = finish + _sent(kind, s, k, costs)
                timeline[r].append({"kind": kind, "stage": s, "micro_batch": i, "start_s": start, "end_s": finish})
                position[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            waiting = [orders[r][position[r]] for r in range(ranks) if position[r] < len(orders[r])]
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
