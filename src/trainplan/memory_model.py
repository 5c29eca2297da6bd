"""Whether a device's host memory is apart from it (:func:`memory_model`): where a plan's swapped-out tensors live,
so whether plans may swap and what the budget check counts. Imports no torch: the workflow reads it at start."""

from __future__ import annotations

from dataclasses import dataclass


HOST_MEMORY = ("shared", "separate")

_NOTES = {
    ("cpu", "shared"): "a CPU standing in for an accelerator: host and device memory are the same RAM, so a swap "
                       "frees nothing; plans are recompute-only and the budget check counts everything the process "
                       "holds (peak_bytes_process)",
    ("cpu", "separate"): "a CPU standing in for an accelerator whose host memory is declared separate: plans may "
                         "swap; their host copies sit in the same RAM but count as host bytes, not against the "
                         "budget (checked on the allocator's bytes)",
    ("cuda", "separate"): "device memory apart from host memory: the budget checks device bytes "
                          "(max_memory_allocated); host copies are pinned host bytes, reported apart",
    ("cuda", "shared"): "host memory declared shared with the device: plans are recompute-only and the budget "
                        "check counts device and pinned host bytes together",
}


@dataclass(frozen=True)
class MemoryModel:
    """Where a device's swapped-out tensors live: in ``separate`` host memory (CUDA: pinned host RAM apart
    from the device's), or in ``shared`` memory (the CPU: the host is the same RAM, so a swap saves nothing)."""

    device_type: str
    host_memory: str

    @property
    def swaps(self) -> bool:
        """Whether a plan may swap: only where host memory is apart from the device's."""
        return self.host_memory == "separate"

    def to_dict(self) -> dict[str, str | bool]:
        return {"host_memory": self.host_memory, "swaps": self.swaps,
                "note": _NOTES[self.device_type, self.host_memory]}


def memory_model(device_type: str, host_memory: str | None = None) -> MemoryModel:
    """The memory model of a device of ``device_type`` (cpu, cuda): ``host_memory`` as configured, else by
    type (cpu: shared, cuda: separate). The one place this is decided (workflow, validation, trainplan.plan)."""
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device type {device_type!r}: expected cpu or cuda")
    chosen = host_memory or ("shared" if device_type == "cpu" else "separate")
    if chosen not in HOST_MEMORY:
        raise ValueError(f"host_memory {chosen!r}: expected one of {HOST_MEMORY}")
    return MemoryModel(device_type, chosen)
