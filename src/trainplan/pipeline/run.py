"""Run a k-stage plan as a pipeline: this process is one rank of ``torchrun``, running its stage under its plan
in ``torch.distributed.pipelining``'s GPipe or 1F1B schedule (or, with v stages per rank, stages s, s + k/v, ...
in its Interleaved1F1B schedule), measuring itself; rank 0 writes the artifact.

>>> # under torchrun --nproc-per-node K (K = the plan's k); see docs/pipeline_run.md
>>> run_pipeline(RunSettings(plan_dir, "tiny_gpt2", spec, schedule="1f1b", micro_batches=4, output=out))
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B, ScheduleLoopedBFS

from trainplan.execute.measure import peak_during, process_meter_available, process_peak_during
from trainplan.execute.plan import StagePlan, load_plan
from trainplan.execute.step import plan_file, plan_layouts
from trainplan.export.tables import graph_tables
from trainplan.export.trace import trace_training_step
from trainplan.io import write_json
from trainplan.models import BuiltModel, build_model, on_device
from trainplan.pipeline.carrier import Carrier
from trainplan.pipeline.check import Reference, compare_with_references
from trainplan.pipeline.errors import PipelineError
from trainplan.pipeline.report import artifact, rank_numbers, transfer_medians
from trainplan.pipeline.split import Flows, split_stage, stage_flows
from trainplan.pipeline.stage import HalfTimes, PlannedStageModule, StageRuntime, TimedStage
from trainplan.pipeline.tied import TiedReduction, tied_partials
from trainplan.schedule.grad_accumulation import accumulated_storages
from trainplan.schedule.pipeline_hold import MULTI_STAGE, refusal
from trainplan.timing import keep_freed_memory, return_freed_memory

log = logging.getLogger(__name__)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved1f1b": ScheduleInterleaved1F1B}
#: when a tied parameter's partial gradient crosses stages: summed and sent once per step (Megatron's embedding
#: group; round-off differs from the single-process step), or in every micro-batch's carrier (bit-identical)
TIED_GRADS = ("step", "micro_batch")


@dataclass(frozen=True)
class RunSettings:
    """One pipeline run: the plan, the model it was made for (name and config entry), the schedule, ``m``
    micro-batches (each the batch the plan was traced with), steps, where rank 0 writes the artifact, and the
    stages each rank runs (1 but under a multi-stage schedule: the run has k / stages_per_rank ranks)."""

    plan: Path
    model: str
    spec: dict[str, Any]
    schedule: str = "1f1b"
    micro_batches: int = 4
    output: Path | None = None  # default: PLAN_DIR/pipeline_run_<schedule>_m<m>.json
    seed: int = 0
    warmup: int = 1
    threads: int = 1
    check: bool = False
    device: str = "cpu"  # or "cuda": one GPU per rank (NCCL)
    repeats: int = 1  # measured steps (medians), after the warm-up steps
    tied_grads: str = "step"  # one of TIED_GRADS
    stages_per_rank: int = 1

    def ranks(self, k: int) -> int:
        """The ranks a plan of ``k`` stages runs on."""
        return k // self.stages_per_rank

    @property
    def artifact(self) -> Path:
        if self.output is not None:
            return self.output
        return plan_file(self.plan).parent / f"pipeline_run_{self.schedule}_m{self.micro_batches}.json"

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON values (paths as strings): what the launcher hands each rank."""
        out = asdict(self)
        out["plan"], out["output"] = str(self.plan), str(self.artifact)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSettings:
        output = Path(data["output"]) if data.get("output") else None
        return cls(**{**data, "plan": Path(data["plan"]), "output": output})


def check_settings(settings: RunSettings, data: dict[str, Any], world: int | None) -> None:
    """What the run refuses before starting: an unknown schedule, m < 1, a schedule that cannot run the plan with
    its m and stages per rank (:func:`trainplan.schedule.pipeline_hold.refusal`), a rank count other than k / stages
    per rank; PipelineError naming the plan."""
    k, v = len(data["stages"]), settings.stages_per_rank
    if settings.schedule not in SCHEDULES:
        raise PipelineError(f"schedule '{settings.schedule}' is not one of {sorted(SCHEDULES)}")
    if settings.micro_batches < 1:
        raise PipelineError(f"micro-batches must be >= 1, got {settings.micro_batches}")
    if settings.repeats < 1:
        raise PipelineError(f"repeats must be >= 1, got {settings.repeats}")
    if settings.tied_grads not in TIED_GRADS:
        raise PipelineError(f"tied gradients '{settings.tied_grads}' is not one of {list(TIED_GRADS)}")
    why = refusal(k, settings.schedule, settings.micro_batches, v)
    if why is not None:
        raise PipelineError(f"{settings.plan}: {why}")
    ranks = settings.ranks(k)
    if world is not None and world != ranks:
        per = "one rank per stage" if v == 1 else f"{v} stages per rank"
        raise PipelineError(f"{settings.plan}: the plan has k={k} stages but {world} rank(s) were launched: run "
                            f"{per} (torchrun --nproc-per-node {ranks})")


def micro_batches(settings: RunSettings, built: BuiltModel) -> list[dict[str, torch.Tensor]]:
    """``m`` micro-batches shaped as the plan's batch: the model's batch for seeds ``seed``, ``seed + 1``, ..."""
    out = [built.batch]
    for i in range(1, settings.micro_batches):
        out.append(build_model(settings.model, settings.spec, seed=settings.seed + i).batch)
    return out


def _device(kind: str) -> torch.device:
    """This rank's device: the CPU, or on CUDA the GPU of its local rank."""
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise PipelineError("--device cuda: no CUDA device here")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _loss_of_output(output: torch.Tensor, _target: torch.Tensor) -> torch.Tensor:
    """The last stage's output is the micro-batch's loss already (its plan computes it)."""
    return output


@dataclass
class StageUnit:
    """One stage a rank runs: its module under its plan and its PipelineStage."""

    index: int
    module: PlannedStageModule
    stage: TimedStage


@dataclass
class Rank:
    """This rank's stages (stage s on rank s mod ``world``), its schedule and its measurements."""

    rank: int
    world: int
    k: int
    device: torch.device
    units: list[StageUnit]
    schedule: Any
    times: HalfTimes  # the compute calls of all its stages
    tied: TiedReduction | None
    micro_batches: int
    batch: dict[str, torch.Tensor]  # the m micro-batches along dimension 0
    target: torch.Tensor

    @property
    def has_last(self) -> bool:
        """Whether this rank runs the last stage (it computes the losses)."""
        return any(u.index == self.k - 1 for u in self.units)

    def unit(self, index: int) -> StageUnit | None:
        return next((u for u in self.units if u.index == index), None)

    def params(self) -> dict[int, torch.Tensor]:
        """The parameters whose gradients this rank's stages compute, by the traced step's input position."""
        return {i: u.module.fixed[i] for u in self.units for i in u.module.rt.halves.grads}

    def zero_grad(self) -> None:
        for u in self.units:
            u.module.zero_grad(set_to_none=True)

    def clock(self) -> float:
        return self.units[0].module.rt.clock()


def build_rank(settings: RunSettings, data: dict[str, Any], stages: list[StagePlan], rank: int, world: int,
               device: torch.device) -> tuple[Rank, BuiltModel, list[dict[str, torch.Tensor]], Reference]:
    """This rank's stage modules, PipelineStages and schedule; also the model, micro-batches and the traced step
    (for the checks)."""
    built = on_device(build_model(settings.model, settings.spec, seed=settings.seed), device)
    traced, flat = trace_training_step(built, sums_in_place=False)  # as the plan's problems (functional_sums)
    tables = graph_tables(traced)
    where = str(plan_file(settings.plan))
    layout, layouts = plan_layouts(stages, traced, flat, tables, where=where)
    flows = stage_flows(layouts, layout, settings.model)
    phase = dict(zip(tables.nodes.name, tables.nodes.phase))
    k = len(stages)
    size = {int(s): int(b) for s, b in zip(tables.tensors.storage, tables.tensors.storage_bytes)}
    partials = tied_partials(traced, flat, layout, layouts, size) if settings.tied_grads == "step" else {}
    reduced = frozenset(partials)
    mine = list(range(rank, k, world))
    tied = TiedReduction(frozenset(mine), world, partials, device) if partials else None
    times = HalfTimes()
    n_fixed = len(traced.param_names) + len(traced.buffer_names)
    units = []
    for s in mine:
        # gradients the plan adds into their sums where made; a tied partial only where it is reduced once per
        # step (else it travels back in every micro-batch's carrier)
        sent_back = set(flows.between(s, s - 1)) - {sid for sid, p in partials.items() if p.producer == s}
        summed = accumulated_storages(data["stages"][s]["problem"]) - sent_back
        stand_ins = frozenset(sid for sid, p in partials.items() if p.receiver == s)
        halves = split_stage(traced, layout, layouts, stages[s].events, s, flows, phase, device=device,
                             summed=summed, zero_stand_ins=stand_ins)
        carrier_in = _carrier(flows, s - 1, size, reduced) if s > 0 else None
        carrier_out = _carrier(flows, s, size, reduced) if s < k - 1 else None
        module = PlannedStageModule(StageRuntime(halves, carrier_in, carrier_out, device, tied, times),
                                    list(flat[:n_fixed]), traced.batch_names)
        units.append(StageUnit(s, module, _timed_stage(module, k, device)))
    schedule = _schedule(settings.schedule, [u.stage for u in units], settings.micro_batches)
    mbs = [{n: t.to(device) for n, t in mb.items()} for mb in micro_batches(settings, built)]
    batch = {n: torch.cat([mb[n] for mb in mbs]) for n in traced.batch_names}
    target = torch.zeros(settings.micro_batches, device=device)
    reference = Reference(data, stages, traced, flat, tables)
    r = Rank(rank, world, k, device, units, schedule, times, tied, settings.micro_batches, batch, target)
    return r, built, mbs, reference


def _timed_stage(module: PlannedStageModule, k: int, device: torch.device) -> TimedStage:
    """A PipelineStage of ``module`` (stage ``module.rt.halves.index`` of ``k``), timed into its runtime's times."""
    rt = module.rt
    example_in = (rt.carrier_in.empty(device, requires_grad=True),) if rt.carrier_in is not None else ()
    example_out = rt.carrier_out.empty(device, requires_grad=True) if rt.carrier_out is not None else \
        torch.empty((), device=device, requires_grad=True)
    return TimedStage(module, rt.halves.index, k, device, input_args=example_in, output_args=example_out,
                      times=rt.times, clock=rt.clock)


def _schedule(name: str, stages: list[TimedStage], m: int) -> Any:
    """Schedule ``name`` of a rank's ``stages`` over ``m`` micro-batches."""
    if name in MULTI_STAGE:
        return SCHEDULES[name](stages, m, loss_fn=_loss_of_output)
    (stage,) = stages
    return SCHEDULES[name](stage, m, loss_fn=_loss_of_output)


def _carrier(flows: Flows, sender: int, size: dict[int, int], reduced: frozenset[int]) -> Carrier:
    back = flows.between(sender + 1, sender)
    return Carrier(sender, tuple((s, size[s]) for s in flows.between(sender, sender + 1)),
                   tuple((s, size[s]) for s in back), reduced.intersection(back))


def _run_schedule(r: Rank, schedule: Any, m: int, batch: dict[str, torch.Tensor], target: torch.Tensor,
                  losses: list[torch.Tensor]) -> None:
    """One step of ``schedule`` over ``m`` micro-batches, then the tied partial gradients reduced (every rank
    takes part)."""
    schedule.step(**batch, target=target if r.has_last else None, losses=losses, return_outputs=False)
    if r.tied is not None:
        r.tied.reduce(r.params(), m)


def _step(r: Rank, losses: list[torch.Tensor]) -> None:
    r.zero_grad()
    _run_schedule(r, r.schedule, r.micro_batches, r.batch, r.target, losses)


def measured_step(r: Rank, *, meter: str | None) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """One timed step: step, compute (PipelineStage's compute calls) and half times, each compute call's stage,
    start and end (seconds from the step's start), and with ``meter`` the peak bytes above what the rank held
    before it, its gradients cleared: ``"process"``, the process's resident memory on the CPU (the allocator's on
    CUDA); ``"allocator"``, torch's allocator's (on the CPU from the profiler's memory events: tensors only)."""
    losses: list[torch.Tensor] = []
    r.times.reset()
    r.zero_grad()  # the last step's gradients are not part of what the rank holds before
    dist.barrier()
    origin: list[float] = []

    def run() -> float:
        origin.append(r.clock())
        _step(r, losses)
        return r.clock() - origin[0]

    if not meter:
        step_s, peak, method = run(), None, "not metered (a timed step)"
    elif meter == "allocator" and r.device.type == "cpu":
        step_s, peak = peak_during(run, r.device)
        method = "torch.profiler memory events: the most allocated above the step's start (tensors only)"
    elif r.device.type == "cuda":
        step_s, peak = peak_during(run, r.device)
        method = "torch.cuda.max_memory_allocated above the allocated bytes before the step"
    elif process_meter_available():
        step_s, peak = process_peak_during(run)
        method = "VmHWM after clear_refs, above VmRSS before the step (freed memory returned)"
    else:
        step_s, peak, method = run(), None, "unavailable (no resettable high-water mark here)"
    t, tied = r.times, r.tied
    actions = [{"kind": a.kind, "stage": a.stage, "micro_batch": a.micro_batch, "start_s": a.start - origin[0],
                "end_s": a.end - origin[0]} for a in t.actions]
    return {"step_s": step_s, "compute_s": t.compute_s, "forward_half_s": t.forward_s,
            "backward_half_s": t.backward_s, "tied_send_s": tied.send_s if tied else 0.0,
            "tied_receive_s": tied.receive_s if tied else 0.0, "peak_bytes": peak, "peak_method": method,
            "actions": actions}, losses


def metered_peaks(r: Rank, readings: int) -> dict[str, Any]:
    """This rank's peak bytes on the process meter (:func:`measured_step`): the median of ``readings`` metered
    steps after one unread (the meter thread's warm-up), each reading, the method and the metered steps' median
    time."""
    measured_step(r, meter="process")
    metered = [measured_step(r, meter="process")[0] for _ in range(readings)]
    peaks = [m["peak_bytes"] for m in metered]
    return {"peak_bytes": None if None in peaks else int(median(peaks)), "peak_bytes_readings": peaks,
            "peak_method": metered[0]["peak_method"] + f" (median of {readings} after one unread)",
            "metered_step_s": median(m["step_s"] for m in metered)}


def send_recv_seconds(r: Rank, m: int) -> tuple[float, dict[str, list[float | None]]]:
    """This rank's seconds sending and receiving one step's carriers alone: for each link s -> s + 1 in turn
    (ranks s mod world and s + 1 mod world), after a barrier, the m forward carriers, then the m gradients back
    (no compute, nobody waiting for a peer). Also the seconds per carrier on each link it is on:
    ``{"forward": [link s -> s+1 ...], "backward": [...]}``, None for the links it is not on."""
    total = 0.0
    per: dict[str, list[float | None]] = {"forward": [None] * (r.k - 1), "backward": [None] * (r.k - 1)}
    for sender in range(r.k - 1):
        out, into = r.unit(sender), r.unit(sender + 1)
        carrier = out.module.rt.carrier_out if out else into.module.rt.carrier_in if into else None
        ends = (sender % r.world, (sender + 1) % r.world)
        for direction, (src, dst) in (("forward", ends), ("backward", ends[::-1])):
            dist.barrier()
            if carrier is None:
                continue
            buffers = [carrier.empty(r.device) for _ in range(m)]
            t0 = r.clock()
            for b in buffers:
                dist.send(b, dst) if r.rank == src else dist.recv(b, src)
            seconds = r.clock() - t0
            total += seconds
            per[direction][sender] = seconds / m
    return total, per


def stage_alone(r: Rank, mb: dict[str, torch.Tensor], repeats: int) -> dict[int, dict[str, Any]]:
    """Seconds of each of this rank's stages' forward and backward of one micro-batch with no other stage
    computing: steps of one micro-batch (GPipe; with several stages per rank LoopedBFS) on second PipelineStages of
    the same modules (after one unmeasured step): medians and each measured step's, by stage. Gradients are
    cleared before and after (run it after anything that reads them)."""
    stages = [_timed_stage(u.module, r.k, r.device) for u in r.units]
    schedule = ScheduleLoopedBFS(stages, 1, loss_fn=_loss_of_output) if len(stages) > 1 else \
        ScheduleGPipe(stages[0], 1, loss_fn=_loss_of_output)
    seconds: dict[tuple[str, int], list[float]] = {(kind, u.index): [] for kind in "FB" for u in r.units}
    target = torch.zeros(1, device=r.device)
    for i in range(repeats + 1):
        r.times.reset()
        r.zero_grad()
        dist.barrier()
        _run_schedule(r, schedule, 1, mb, target, [])
        if i:
            for a in r.times.actions:
                seconds[(a.kind, a.stage)].append(a.end - a.start)
    r.zero_grad()
    return {u.index: {"forward_s": median(seconds[("F", u.index)]), "backward_s": median(seconds[("B", u.index)]),
                      "forward_s_repeats": seconds[("F", u.index)], "backward_s_repeats": seconds[("B", u.index)]}
            for u in r.units}


def receive_buffer_bytes(r: Rank) -> int:
    """Bytes of the receive buffers this rank's PipelineStages keep (one per micro-batch and received tensor, made
    at the first step: :func:`trainplan.schedule.pipeline_hold.receive_buffers`), read off their receive infos
    (torch's ``args_recv_info`` and ``grad_recv_info``, private)."""
    held: dict[int, int] = {}
    for u in r.units:
        for infos in (*u.stage.args_recv_info.values(), *u.stage.grad_recv_info.values()):
            for info in infos:
                if isinstance(getattr(info, "buffer", None), torch.Tensor):
                    st = info.buffer.untyped_storage()
                    held[st.data_ptr()] = st.nbytes()
    return sum(held.values())


def stage_record(u: StageUnit, rank: int, events: int) -> dict[str, Any]:
    """What a rank reports of one of its stages (its times alone are added later)."""
    h, rt = u.module.rt.halves, u.module.rt
    return {"stage": u.index, "rank": rank, "split_event": h.split_event, "events": events,
            "stash_values": h.stash_values, "carrier_in_bytes": rt.carrier_in.nbytes if rt.carrier_in else 0,
            "carrier_out_bytes": rt.carrier_out.nbytes if rt.carrier_out else 0, "parameters": len(h.grads),
            "relayed_storages": len(set(h.received_forward) & set(h.sent_forward))
            + len(set(h.received_backward) & set(h.sent_backward))}


def run_pipeline(settings: RunSettings) -> dict[str, Any] | None:
    """This rank's part of the run (under torchrun); rank 0 returns the artifact it wrote, the others None."""
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    data, stages = load_plan(plan_file(settings.plan))
    check_settings(settings, data, world)
    torch.set_num_threads(settings.threads)
    allocator = keep_freed_memory()  # timed as the profile times its ops: the heap's pages reused step to step
    device = _device(settings.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        r, built, mbs, reference = build_rank(settings, data, stages, rank, world, device)
        for _ in range(settings.warmup):
            _step(r, [])
        steps, losses = [], []
        for _ in range(settings.repeats):
            numbers, losses = measured_step(r, meter=None)
            steps.append(numbers)
        links = [send_recv_seconds(r, settings.micro_batches) for _ in range(settings.repeats)]
        mine = {"rank": rank, "stages": [stage_record(u, rank, len(stages[u.index].events)) for u in r.units],
                "receive_buffer_bytes": receive_buffer_bytes(r),
                **rank_numbers(steps, [total for total, _ in links]),
                "transfer_s": transfer_medians([per for _, per in links]),
                "tied_partials": [{"parameter": p.name, "storage": p.storage, "producer": p.producer,
                                   "receiver": p.receiver} for p in sorted(r.tied.partials.values(),
                                                                           key=lambda p: p.storage)]
                if r.tied else [],
                "losses": [float(x) for x in losses]}
        if settings.check:
            grads = {reference.traced.param_names[i]: p.grad for i, p in sorted(r.params().items())}
            tied = frozenset(p.name for p in r.tied.partials.values()) if r.tied else frozenset()
            mine["check"] = compare_with_references(grads, losses, built, mbs, reference, where=str(settings.plan),
                                                    tied=tied)
        alone = stage_alone(r, {n: mbs[0][n] for n in r.batch}, settings.repeats)
        for record in mine["stages"]:
            record["alone"] = alone[record["stage"]]
        # The peak from more steps with freed memory returned to the system, so that resident memory tracks
        # what the rank holds (a step pays a page fault per 4 KiB it allocates then: ~20% of GPT-2's time): one
        # unread, as the meter thread's first step allocates the BLAS buffers it then keeps (GPT-2's last stage:
        # +10 MiB), then the median of ``repeats`` readings.
        memory = return_freed_memory()
        mine.update(metered_peaks(r, settings.repeats))
        # and the tensors alone, to set against the plan's accounting (on CUDA the metered step's is that already)
        tensors = measured_step(r, meter="allocator")[0] if device.type == "cpu" else mine
        mine.update(tensor_peak_bytes=tensors["peak_bytes"], tensor_peak_method=tensors["peak_method"])
        gathered: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(mine, gathered if rank == 0 else None, dst=0)
        if rank != 0:
            return None
        out = artifact(settings, data, gathered, stages, device=str(device), backend=dist.get_backend(),
                       memory=f"timed: {allocator}; metered: {memory}")
        write_json(settings.artifact, out)
        log.info("wrote %s", settings.artifact)
        return out
    finally:
        dist.destroy_process_group()

