"""The plan's own prediction event by event: device bytes after each event and while it runs."""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.schedule import Problem


@dataclass
class Predicted:
    """Per-event predicted bytes (fixed included) and time; ``peak``/``time`` equal :func:`replay`'s.
    ``bytes_peak`` counts a running op's workspace (what its allocator holds); ``storage_peak`` only the
    storages (what the executor's storage meter sees: a kernel's temporaries are not storages of the plan)."""

    bytes_after: list[int]
    bytes_peak: list[int]
    seconds: list[float]
    storage_peak: list[int]

    @property
    def peak(self) -> int:
        return max(self.bytes_peak, default=0)

    @property
    def storage_peak_bytes(self) -> int:
        return max(self.storage_peak, default=0)

    @property
    def time(self) -> float:
        return float(sum(self.seconds))


def predict(problem: Problem, events: list[tuple[str, str]]) -> Predicted:
    """Replay's accounting kept per event: a compute holds output + workspace on top of what is resident, and a
    kernel's further outputs (ops with ``of``) exist from its first compute: those not taken yet count too."""
    used = problem.fixed_bytes
    after: list[int] = []
    peak: list[int] = []
    seconds: list[float] = []
    storage: list[int] = []
    done: set[int] = set()
    untaken: list[int] = []  # further outputs of the kernel just computed, not taken yet
    for kind, oid in events:
        u = problem.index[oid]
        op = problem.ops[u]
        # a kernel's temporaries: its workspace beyond its further outputs (which stage_problem puts there too)
        extras = sum(problem.ops[v].bytes for v in problem.outputs_of.get(u, ()))
        temporary = max(0, op.workspace - extras) if kind == "compute" else 0
        during = used + sum(problem.ops[v].bytes for v in untaken) + op.bytes + op.workspace
        if kind == "compute":
            used += op.bytes
            seconds.append(op.time)
            if u in untaken:
                untaken.remove(u)
                during = used + sum(problem.ops[v].bytes for v in untaken)  # taken: it was counted already
                temporary = 0
            elif u not in done:
                untaken = list(problem.outputs_of.get(u, ()))
            done.add(u)
        elif kind == "free":
            used -= op.bytes
            seconds.append(0.0)
        else:
            used += op.bytes if kind == "swap_in" else 0
            seconds.append(op.bytes / problem.bandwidth)
        pending = sum(problem.ops[v].bytes for v in untaken)
        after.append(used + pending)
        peak.append(during if kind == "compute" else used + pending)
        storage.append(peak[-1] - temporary)
    return Predicted(after, peak, seconds, storage)
