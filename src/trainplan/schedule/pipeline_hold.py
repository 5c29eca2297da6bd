"""What a pipeline stage holds besides the micro-batch it runs, under 1F1B or GPipe with m micro-batches.

Counted on GPT-2 small's default two-stage plan (the allocator's live tensors at each rank's peak; the sum below
matches each rank's metered tensor peak to a few bytes), a stage s of k holds its running micro-batch as its plan
says, plus

- the **stashes** of the other micro-batches in flight, ``in_flight(s) - 1`` of them, each what the plan holds at
  its split (the first backward event: :func:`split_position`), where a micro-batch's forward hands over to its
  backward (:func:`stash_bytes`), and the gradient carriers sent back and not yet waited on
  (:func:`pending_gradient_sends`), a micro-batch's once its stash is gone (:func:`others_held`);
- with m > 1, the **gradient running sums**: from the first micro-batch's backward on, every gradient the stage
  makes (its parameters' gradients, and a tied weight's partial that it sums for another stage) is held while
  the next micro-batch makes its own (:func:`gradient_sum_bytes`); each new gradient is added into its sum where
  it is made (:mod:`trainplan.schedule.grad_accumulation`), so the stage's schedule counts it only while made;
- the **carriers** (:func:`carriers_held`): the tensors neighbouring stages exchange, packed copies of what
  crosses a link, held per micro-batch in flight, each in-flight micro-batch's copy of its inputs
  (:func:`inputs_held`), and on
  the last stage every micro-batch's loss (:func:`loss_bytes`), and the receive buffers PipelineStage keeps, one
  per micro-batch and direction (:func:`receive_buffers`).

Under 1F1B a stage has ``min(k - s, m)`` micro-batches in flight; under GPipe, which runs every forward before any
backward, all m; under Interleaved1F1B, v stages on each of k / v ranks, what torch's schedule order holds
(:func:`in_flight`). So a stage's peak on its rank is the plan's peak + ``sums + carriers`` + the other
micro-batches' stashes and pending sends (:func:`others_held`: ``(in_flight - 1) * stash`` without pending sends);
a stage problem solved for a pipeline gets the stage's budget less that reserve, with the stash of the plan without
recompute (what the plan's own stash is measured against afterwards). A rank running v stages holds
at most the sum of theirs: its budget is theirs summed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

from trainplan.schedule.grad_accumulation import accumulates


#: the schedules a stage can be planned for (torch.distributed.pipelining's ScheduleGPipe, Schedule1F1B and
#: ScheduleInterleaved1F1B)
SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b")
#: the schedules running several stages per rank (stage s on rank s mod ranks, torch's "loop" placement)
MULTI_STAGE = ("interleaved1f1b",)


def check_placement(k: int, schedule: str, stages_per_rank: int) -> None:
    """ValueError for an unknown schedule, or stages per rank it does not run: 1 but under a multi-stage schedule,
    there at least 2, dividing k, on at least 2 ranks."""
    if schedule not in SCHEDULES:
        raise ValueError(f"pipeline schedule {schedule!r}: expected one of {SCHEDULES}")
    if schedule in MULTI_STAGE:
        if stages_per_rank < 2 or k % stages_per_rank or k // stages_per_rank < 2:
            raise ValueError(f"{schedule} runs v >= 2 stages on each of k / v >= 2 ranks; {stages_per_rank} stage(s) "
                             f"per rank does not fit k={k}")
    elif stages_per_rank != 1:
        raise ValueError(f"{schedule} runs one stage per rank, not {stages_per_rank} (use interleaved1f1b)")


def interleaved_rounds(ranks: int, micro_batches: int) -> int:
    """Interleaved1F1B's rounds of m micro-batches on ``ranks`` ranks, max(1, m // ranks), as torch's schedule
    counts them; ValueError where m is not a whole number of rounds (the schedule refuses it)."""
    rounds = max(1, micro_batches // ranks)
    if micro_batches % rounds:
        raise ValueError(f"Interleaved1F1B runs m in rounds of {ranks} (the ranks): m={micro_batches} is not a "
                         f"multiple of its {rounds} rounds")
    return rounds


def refusal(k: int, schedule: str, micro_batches: int, stages_per_rank: int = 1) -> str | None:
    """Why ``schedule`` cannot run a ``k``-stage plan with m micro-batches and ``stages_per_rank``, or None: the
    placement (:func:`check_placement`), 1F1B's m >= k, Interleaved1F1B's whole rounds."""
    try:
        check_placement(k, schedule, stages_per_rank)
        if schedule in MULTI_STAGE:
            interleaved_rounds(k // stages_per_rank, micro_batches)
    except ValueError as exc:
        return str(exc)
    if schedule == "1f1b" and micro_batches < k:
        return f"1F1B needs at least as many micro-batches as stages: m={micro_batches} < k={k}"
    return None


@lru_cache(maxsize=64)
def interleaved_in_flight(k: int, ranks: int, micro_batches: int) -> tuple[int, ...]:
    """Per stage, the most micro-batches in flight (forward run, backward not) in the order torch's
    ScheduleInterleaved1F1B gives each of ``ranks`` ranks (its ``_calculate_single_rank_operations``, run on the
    attributes its constructor sets: the order it then executes; ValueError for an ``m`` it refuses). Imports torch
    here: the solver rules load this module without it."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, _ComputationType

    rounds = interleaved_rounds(ranks, micro_batches)
    attrs = SimpleNamespace(n_local_stages=k // ranks, pp_group_size=ranks, _n_microbatches=micro_batches,
                            number_of_rounds=rounds, microbatches_per_round=micro_batches // rounds)
    held, most = [0] * k, [0] * k
    for rank in range(ranks):
        for action in ScheduleInterleaved1F1B._calculate_single_rank_operations(attrs, rank):
            if action is not None:
                s = action.stage_index
                held[s] += 1 if action.computation_type == _ComputationType.FORWARD else -1
                most[s] = max(most[s], held[s])
    return tuple(most)


def in_flight(stage: int, k: int, micro_batches: int, schedule: str = "1f1b", stages_per_rank: int = 1) -> int:
    """Micro-batches whose activations stage ``stage`` (0-based) of ``k`` holds at once: under 1F1B
    ``min(k - stage, m)``, under GPipe all ``m`` (every forward runs before the first backward), under
    Interleaved1F1B with ``stages_per_rank`` what its order holds (:func:`interleaved_in_flight`)."""
    check_placement(k, schedule, stages_per_rank)
    if schedule in MULTI_STAGE:
        return interleaved_in_flight(k, k // stages_per_rank, micro_batches)[stage]
    return micro_batches if schedule == "gpipe" else min(k - stage, micro_batches)


@dataclass(frozen=True)
class PipelineHold:
    """The pipeline a stage problem is solved for: ``k`` stages, ``micro_batches`` per step, its ``schedule``, and
    the stages each rank runs (a multi-stage schedule's; the rank's budget then is its stages' summed)."""

    k: int
    micro_batches: int
    schedule: str = "1f1b"
    stages_per_rank: int = 1

    def __post_init__(self) -> None:
        in_flight(0, self.k, self.micro_batches, self.schedule, self.stages_per_rank)  # bad ones raise, named

    def in_flight(self, stage: int) -> int:
        return in_flight(stage, self.k, self.micro_batches, self.schedule, self.stages_per_rank)

    def pending_gradient_sends(self, stage: int) -> int:
        return pending_gradient_sends(stage, self.k, self.micro_batches, self.schedule, self.stages_per_rank)

    @property
    def accumulates(self) -> bool:
        """Whether gradients are summed across micro-batches (held while the next one runs)."""
        return self.micro_batches > 1


def split_position(problem: dict[str, Any], events: Sequence[Sequence[str]]) -> int:
    """Position of the first compute of an op of the backward phase (a backward op, or the receipt of a gradient
    from the next stage); ``len(events)`` if none (a problem without phases)."""
    phase = {op["id"]: op.get("phase", "forward") for op in problem["ops"]}
    return next((pos for pos, (kind, oid) in enumerate(events) if kind == "compute" and phase[oid] == "backward"),
                len(events))


def stash_bytes(problem: dict[str, Any], events: Sequence[Sequence[str]]) -> int:
    """Device bytes the schedule holds just before its split (fixed bytes apart): what one micro-batch in flight
    keeps between its forward and its backward. A swapped-out op holds none (its host copy is not device memory;
    where host memory is shared, plans do not swap)."""
    size = {op["id"]: int(op["bytes"]) for op in problem["ops"]}
    resident: set[str] = set()
    for kind, oid in events[:split_position(problem, events)]:
        if kind in ("compute", "swap_in"):
            resident.add(oid)
        elif kind == "free":  # a swap-out copies; its free releases the device bytes
            resident.discard(oid)
    return sum(size[o] for o in resident)


def carrier_bytes(problem: dict[str, Any]) -> tuple[int, int]:
    """Bytes of the carrier on the stage's link to the next stage and on its link from the previous one (0: no
    link): each carries the storages crossing it both ways in one float32 tensor the size of the larger
    direction (``trainplan.pipeline.carrier``); tied partials are sent once per step instead. A storage read
    two or more stages away is relayed by the stages between, whose problems do not list it: not counted."""
    keep = set(problem.get("keep", ()))

    def total(ops: list[dict[str, Any]], phase: str) -> int:
        return sum(int(op["bytes"]) for op in ops if op.get("phase", "forward") == phase)

    sent = [op for op in problem["ops"] if op["id"] in keep and not (op.get("gradient") or op.get("loss") or
                                                                     op.get("boundary"))]
    received = [op for op in problem["ops"] if op.get("boundary") and not op.get("tied_partial")]
    out = max(total(sent, "forward"), total(received, "backward"))
    into = max(total(received, "forward"), total(sent, "backward"))
    return (4 * -(-out // 4), 4 * -(-into // 4))


def gradient_sum_bytes(problem: dict[str, Any]) -> int:
    """Bytes of the gradients the stage sums across micro-batches: its ops marked ``gradient`` (by
    :func:`trainplan.schedule.stage_problem.stage_problem`), those added into their sums where made
    (:mod:`trainplan.schedule.grad_accumulation`) included."""
    return sum(int(op["bytes"]) + int(op.get("accumulated_bytes", 0)) for op in problem["ops"] if op.get("gradient"))


def held_gradient_bytes(problem: dict[str, Any], micro_batches: int) -> int:
    """Gradient bytes a rank holds besides its schedule's peak: the sums with m > 1, and with any m where the
    problem's gradients are added into their sums where made (the schedule counts them only while made)."""
    return gradient_sum_bytes(problem) if micro_batches > 1 or accumulates(problem) else 0


def loss_bytes(problem: dict[str, Any]) -> int:
    """Bytes of the loss the stage makes (0 but on the last stage): the schedule keeps one per micro-batch."""
    return sum(int(op["bytes"]) for op in problem["ops"] if op.get("loss"))


def inputs_held(in_flight: int, input_bytes: int) -> int:
    """Bytes of the micro-batch inputs a rank holds besides its fixed bytes: a copy of every batch input per
    micro-batch in flight (the stage's module copies its slice of the step's batch, all inputs, read by the stage or
    not, and keeps them for its backward)."""
    return in_flight * input_bytes


def pending_gradient_sends(stage: int, k: int, micro_batches: int, schedule: str = "1f1b",
                           stages_per_rank: int = 1) -> int:
    """Gradient carriers stage ``stage`` of ``k`` has sent back and its schedule not yet waited on while it runs a
    backward (torch.distributed.pipelining's schedules hold each send's tensor until they wait on it): GPipe waits
    on every backward send after the last backward, so m - 1 are pending during it; 1F1B waits on each before the
    stage's next forward, but in its cool-down each backward runs while the previous one's send is pending (one,
    on a stage with a cool-down: two or more micro-batches in flight). Counted on GPT-2 small, k = 4, GPipe,
    m = 4: the last stage, sent the logits' gradient (49 MiB) back, held two more than one at its peak. The 1F1B
    one is read from the schedule's code and not held at the peak where a stash outweighs a carrier (a cool-down
    backward holds one stash fewer): on a 4-layer GPT-2 of 1-2.5 MiB carriers, k = 4, m = 8, the middle stages
    held exactly one carrier less than counted; so it is conservative by one carrier there. The multi-stage schedules
    (torch's ``_PipelineScheduleRuntime``) wait on every send at the step's end: m - 1 pending at the last
    backward, as GPipe's."""
    if schedule == "gpipe" or schedule in MULTI_STAGE:
        return micro_batches - 1
    return 1 if in_flight(stage, k, micro_batches, schedule, stages_per_rank) >= 2 else 0


def forward_carriers(in_flight: int, micro_batches: int, schedule: str = "1f1b") -> int:
    """Forward carriers a sender holds at its peak: under 1F1B each in-flight micro-batch's until that
    micro-batch's backward (PipelineStage's cache; the send's tensor is the cached one), and one more whose send
    the schedule has not waited on yet; under GPipe and the multi-stage schedules, whose step keeps every
    forward send's work (and so its tensor) to its end, all m. (Counted on a 4-layer GPT-2 of 1-2.5 MiB carriers,
    m = 8: at k = 4 on two ranks under Interleaved1F1B the ranks' tensors were 9-11 MiB above the 1F1B count; at
    k = 2 under GPipe stage 0 held one carrier less than m + 1.)"""
    return micro_batches if schedule == "gpipe" or schedule in MULTI_STAGE else in_flight + 1


def carriers_held(forward: int, out: int, into: int) -> int:
    """Carrier bytes a rank holds at its peak: ``forward`` forward carriers (:func:`forward_carriers`); the
    receiver packs one gradient carrier at a time (those it sent and its schedule has not waited on:
    :func:`others_held`). (Counted on GPT-2 small, k = 2, m = 4, 1F1B: stage 0 held three 4.5 MiB carriers at its
    peak, stage 1 one.)"""
    return forward * out + into


def receive_buffers(micro_batches: int, out: int, into: int) -> int:
    """Bytes of the receive buffers a stage keeps: torch.distributed.pipelining's PipelineStage makes one per
    micro-batch for each tensor it receives, the forward carrier from the previous stage and the gradient carrier
    from the next, at the first step, and keeps them from step to step (received carriers are unpacked into
    copies, :class:`trainplan.pipeline.carrier.Carrier`, so they are held besides). (Counted on a two-rank toy
    pipeline, 8 micro-batches of 1 MiB: 8 MiB per direction, there before the second step.)"""
    return micro_batches * (out + into)


def copies_held(problem: dict[str, Any], in_flight: int, micro_batches: int, schedule: str = "1f1b",
                link: tuple[int, int] | None = None) -> int:
    """What a rank holds whatever its schedule, gradient sums and pending gradient sends apart: its carriers
    (``link``: its carrier bytes out and in, default the problem's) and receive buffers, its micro-batch input
    copies and its losses."""
    out, into = link or carrier_bytes(problem)
    return (carriers_held(forward_carriers(in_flight, micro_batches, schedule), out, into)
            + receive_buffers(micro_batches, out, into)
            + inputs_held(in_flight, problem.get("input_bytes", 0)) + micro_batches * loss_bytes(problem))


def others_held(in_flight: int, stash: int, pending: int = 0, into: int = 0) -> int:
    """Bytes of the other micro-batches beside the running one: each holds its ``stash`` from its forward to its
    backward, then, sent back, its gradient carrier (``into`` bytes) until the schedule waits on the send; at most
    ``pending`` such sends (:func:`pending_gradient_sends`), and a micro-batch is never both. Under each schedule
    the stashed and the pending together are at most max(in_flight - 1, pending) (GPipe: its m - 1 others either
    way; 1F1B: a cool-down backward, which has one pending, holds one stash fewer; the multi-stage schedules: the
    m - 1 others), so with p' = min(pending, in_flight - 1) the most held is (in_flight - 1 - p') x stash + p' x
    max(stash, into) + (pending - p') x into."""
    both = min(pending, in_flight - 1)
    return (in_flight - 1 - both) * stash + both * max(stash, into) + (pending - both) * into


def largest_stash(room: int, in_flight: int, pending: int = 0, into: int = 0) -> int:
    """The largest stash whose :func:`others_held` fits ``room`` bytes (in_flight >= 2); negative where none does."""
    both = min(pending, in_flight - 1)
    if room < pending * into:  # the pending sends alone (a stash of 0)
        return -1
    alone = in_flight - 1 - both  # others that can only be stashed
    if alone and (room - pending * into) // alone <= into:
        return (room - pending * into) // alone
    return (room - (pending - both) * into) // (in_flight - 1)


def held_beside(sums: int, carriers: int, in_flight: int, stash: int, pending: int = 0, into: int = 0) -> int:
    """Bytes a stage holds on its rank beside its running micro-batch's schedule: its gradient ``sums``, its
    ``carriers`` (:func:`copies_held`) and the other micro-batches' stashes and pending gradient sends
    (:func:`others_held`). The one place the rank peak (schedule peak + this) and a stage's reserve (this, with
    the plan without recompute's stash) are summed."""
    return sums + carriers + others_held(in_flight, stash, pending, into)


@dataclass(frozen=True)
class StageHold:
    """A stage's hold in a pipeline: ``in_flight`` micro-batches, gradient ``sums`` bytes (0 without accumulation),
    the ``carriers`` it holds (with its micro-batch input copies and losses), the ``no_recompute_stash`` bytes
    (the reserve's stash), and its ``pending`` gradient sends of ``into`` bytes each. The rank's peak with a
    schedule is its peak + :func:`held_beside` with that schedule's own stash (``PipelineMetrics.rank_peak_bytes``)."""

    in_flight: int
    sums: int
    no_recompute_stash: int
    carriers: int = 0
    pending: int = 0
    into: int = 0

    @property
    def reserve(self) -> int:
        """Bytes kept from the running micro-batch's budget: the sums, the carriers and the other micro-batches'
        stashes (no recompute) and pending sends."""
        return held_beside(self.sums, self.carriers, self.in_flight, self.no_recompute_stash, self.pending,
                           self.into)

    def to_dict(self) -> dict[str, Any]:
        return {"in_flight": self.in_flight, "gradient_sum_bytes": self.sums, "carrier_bytes": self.carriers,
                "pending_gradient_sends": self.pending, "carrier_in_bytes": self.into,
                "no_recompute_stash_bytes": self.no_recompute_stash, "reserve_bytes": self.reserve}


def hold_beside(hold: dict[str, Any], stash: int, sums: bool = True) -> int:
    """:func:`held_beside` of a problem's ``pipeline`` record (:meth:`StageHold.to_dict`) with ``stash`` (without
    the gradient sums where not ``sums``); a record without pending sends counts them in its carriers."""
    return held_beside(hold["gradient_sum_bytes"] if sums else 0, hold["carrier_bytes"], hold["in_flight"], stash,
                       hold.get("pending_gradient_sends", 0), hold.get("carrier_in_bytes", 0))


def stage_hold(problem: dict[str, Any], hold: PipelineHold, stage: int, no_recompute_events: Sequence[Sequence[str]]
               ) -> StageHold:
    """Stage ``stage``'s hold under ``hold``, its stash taken from the schedule without recompute."""
    sums = gradient_sum_bytes(problem) if hold.accumulates else 0
    n = hold.in_flight(stage)
    return StageHold(n, sums, stash_bytes(problem, no_recompute_events),
                     copies_held(problem, n, hold.micro_batches, hold.schedule),
                     hold.pending_gradient_sends(stage), carrier_bytes(problem)[1])
