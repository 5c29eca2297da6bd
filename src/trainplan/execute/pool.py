"""A stage's device memory pool and host pool, holding real storages keyed by plan storage id."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from trainplan.execute.layout import Slot


def byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """A 1-D uint8 tensor over a whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def clone_storage(storage: torch.UntypedStorage, device: torch.device) -> torch.UntypedStorage:
    """A fresh device storage holding a copy of ``storage`` (a transfer between stage devices)."""
    out = torch.empty(storage.nbytes(), dtype=torch.uint8, device=device)
    out.copy_(byte_view(storage))
    return out.untyped_storage()


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


@dataclass
class DevicePool:
    """Storages resident on one stage's device.

    ``resident``: storages the plan holds (by storage id). ``pending``: extra outputs of a multi-output
    kernel kept until the op holding them is computed (value, producing op). ``extras``: a slot the plan
    takes for a view that came out as a fresh storage. ``fixed``: parameters, buffers and inputs.
    """

    fixed: dict[int, torch.UntypedStorage]
    resident: dict[int, torch.UntypedStorage] = field(default_factory=dict)
    pending: dict[int, tuple[torch.UntypedStorage, str]] = field(default_factory=dict)
    extras: dict[Slot, tuple[torch.Tensor, int]] = field(default_factory=dict)  # slot -> (tensor, storage id)
    views: dict[int, dict[Slot, torch.Tensor]] = field(default_factory=dict)

    def storage(self, sid: int) -> torch.UntypedStorage | None:
        if sid in self.fixed:
            return self.fixed[sid]
        if sid in self.resident:
            return self.resident[sid]
        if sid in self.pending:
            return self.pending[sid][0]
        return None

    def put(self, sid: int, storage: torch.UntypedStorage) -> None:
        self.views.pop(sid, None)
        self.pending.pop(sid, None)
        self.resident[sid] = storage

    def drop(self, sid: int) -> None:
        """Release a storage, its cached views and any slot taken for a view of it."""
        self.views.pop(sid, None)
        self.resident.pop(sid, None)
        for slot in [s for s, (_, owner) in self.extras.items() if owner == sid]:
            del self.extras[slot]

    def drop_pending(self, sid: int) -> None:
        """Release a pending storage (an extra kernel output, a fused group's internal one) and its views."""
        self.pending.pop(sid, None)
        self.views.pop(sid, None)

    def drop_pending_of(self, op_id: str) -> None:
        for sid in [s for s, (_, op) in self.pending.items() if op == op_id]:
            self.drop_pending(sid)

    def held(self) -> dict[int, int]:
        """Bytes of every distinct storage held, keyed by data pointer (fixed storages included)."""
        out = {st.data_ptr(): st.nbytes() for st in self.fixed.values()}
        out.update((st.data_ptr(), st.nbytes()) for st in self.resident.values())
        out.update((st.data_ptr(), st.nbytes()) for st, _ in self.pending.values())
        out.update((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t, _ in self.extras.values())
        return out

    def device_bytes(self) -> int:
        """Device bytes held, each storage counted once however many views share it."""
        return int(sum(self.held().values()))
