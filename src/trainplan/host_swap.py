"""Copies of device storages in host memory: the swap path a plan's ``swap_out`` and ``swap_in`` run
(``execute``) and the profile times as the host link (``profile.link``). Whether a device's host memory is apart
from it: :mod:`trainplan.memory_model`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


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
