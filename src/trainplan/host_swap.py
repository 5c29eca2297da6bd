"""Copies of device storages in host memory: whether a device's host memory is apart from it
(:func:`memory_model`), the swap path a plan's ``swap_out`` and ``swap_in`` run (``execute``) and the profile
times as the host link (``profile.link``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


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


def byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """A 1-D uint8 tensor over a whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


@dataclass
class HostCopy:
    """A storage's bytes in host memory: a numpy buffer (CPU), or a pinned tensor with the event that marks
    its copy done on the side stream (CUDA)."""

    data: np.ndarray | torch.Tensor
    done: torch.cuda.Event | None = None

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def to_host(storage: torch.UntypedStorage, stream: torch.cuda.Stream | None) -> HostCopy:
    """Copy a storage to the host: into a numpy buffer when ``stream`` is None or the storage is on the host
    already (outside torch's CPU allocator, so the allocator cross-check sees device memory only); else into
    pinned memory, non-blocking on ``stream`` after the work queued so far."""
    src = byte_view(storage)
    if stream is None or storage.device.type != "cuda":
        buf = np.empty(storage.nbytes(), dtype=np.uint8)
        torch.from_numpy(buf).copy_(src)
        return HostCopy(buf)
    host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=True)
    stream.wait_stream(torch.cuda.current_stream(storage.device))
    with torch.cuda.stream(stream):
        host.copy_(src, non_blocking=True)
        src.record_stream(stream)
        done = torch.cuda.Event()
        done.record(stream)
    return HostCopy(host, done)


def from_host(copy: HostCopy, device: torch.device, stream: torch.cuda.Stream | None) -> torch.UntypedStorage:
    """A fresh storage on ``device`` (on the host for a numpy copy) holding ``copy``'s bytes; on CUDA copied
    non-blocking on ``stream``, which the current stream then waits for."""
    if isinstance(copy.data, np.ndarray):
        out = torch.empty(copy.data.nbytes, dtype=torch.uint8)
        out.copy_(torch.from_numpy(copy.data))
        return out.untyped_storage()
    assert stream is not None and copy.done is not None
    out = torch.empty(copy.data.numel(), dtype=torch.uint8, device=device)
    stream.wait_event(copy.done)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        out.copy_(copy.data, non_blocking=True)
        out.record_stream(stream)
    torch.cuda.current_stream(device).wait_stream(stream)
    return out.untyped_storage()


@dataclass
class HostPool:
    """Host copies of swapped-out storages (:func:`to_host`), with a side stream on CUDA. A storage already
    in host memory in a CUDA step (efficient attention's philox seed and offset) is copied as on the CPU and
    comes back there."""

    device: torch.device
    copies: dict[int, HostCopy] = field(default_factory=dict)
    stream: torch.cuda.Stream | None = None

    def __post_init__(self) -> None:
        if self.device.type == "cuda":
            self.stream = torch.cuda.Stream(self.device)

    def save(self, sid: int, storage: torch.UntypedStorage) -> None:
        self.copies[sid] = to_host(storage, self.stream)

    def load(self, sid: int) -> torch.UntypedStorage:
        return from_host(self.copies[sid], self.device, self.stream)

    def nbytes(self) -> int:
        return int(sum(c.nbytes for c in self.copies.values()))
