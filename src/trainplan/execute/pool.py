"""A stage's device memory pool, holding real storages keyed by plan storage id, and the copy of a storage
from one stage's device to another's."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trainplan.execute.layout import Slot
from trainplan.host_swap import byte_view
from trainplan.memory_model import storage_weight


def clone_storage(storage: torch.UntypedStorage, device: torch.device) -> torch.UntypedStorage:
    """A fresh device storage holding a copy of ``storage`` (a transfer between stage devices)."""
    out = torch.empty(storage.nbytes(), dtype=torch.uint8, device=device)
    out.copy_(byte_view(storage))
    return out.untyped_storage()


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
    allocation: str | None = None  # storages weighed at this device type's allocation sizes, as the plan weighs them

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
        """Release a pending storage (an extra kernel output) and its views."""
        self.pending.pop(sid, None)
        self.views.pop(sid, None)

    def drop_pending_of(self, op_id: str) -> None:
        for sid in [s for s, (_, op) in self.pending.items() if op == op_id]:
            self.drop_pending(sid)

    def held(self) -> dict[int, int]:
        """Bytes of every distinct storage held (as the plan weighs them: ``allocation``), keyed by data pointer
        (fixed storages included)."""
        storages = [*self.fixed.values(), *self.resident.values(), *(st for st, _ in self.pending.values()),
                    *(t.untyped_storage() for t, _ in self.extras.values())]
        return {st.data_ptr(): storage_weight(self.allocation, st.nbytes()) for st in storages}

    def device_bytes(self) -> int:
        """Device bytes held, each storage counted once however many views share it."""
        return int(sum(self.held().values()))
