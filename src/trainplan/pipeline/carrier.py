"""The tensor two neighbouring stages exchange per micro-batch: their storages' bytes packed into one float32
tensor, forward in the value and backward in its gradient, so that PipelineStage sends and receives it as any
activation and its gradient (which have one shape, the larger of the two directions'). Tied parameters' partial
gradients reduced once per step (:mod:`trainplan.pipeline.tied`) cross the link but not in the carrier."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from trainplan.host_swap import byte_view
from trainplan.pipeline.errors import PipelineError


@dataclass(frozen=True)
class Carrier:
    """Stage ``sender`` -> ``sender + 1``: the storages sent forward and those sent back, with their bytes;
    ``reduced``: storages sent back once per step instead (left out of the carrier)."""

    sender: int
    forward: tuple[tuple[int, int], ...]  # (plan storage id, bytes), in order
    backward: tuple[tuple[int, int], ...]
    reduced: frozenset[int] = frozenset()

    @property
    def numel(self) -> int:
        size = max(sum(n for _, n in self.forward), sum(n for s, n in self.backward if s not in self.reduced))
        return max(1, -(-size // 4))

    @property
    def nbytes(self) -> int:
        return 4 * self.numel

    def empty(self, device: torch.device, requires_grad: bool = False) -> torch.Tensor:
        return torch.empty(self.numel, dtype=torch.float32, device=device, requires_grad=requires_grad)

    def pack(self, storages: Sequence[torch.UntypedStorage], backward: bool, device: torch.device) -> torch.Tensor:
        """A carrier holding ``storages`` (those of the forward or the ``backward`` direction, in order; the
        ``reduced`` ones are skipped)."""
        entries = self.backward if backward else self.forward
        out = self.empty(device)
        raw = out.view(torch.uint8)
        offset = 0
        for (sid, nbytes), st in zip(entries, storages, strict=True):
            if backward and sid in self.reduced:
                continue
            if st.nbytes() != nbytes:
                raise PipelineError(f"stages {self.sender}/{self.sender + 1}: storage {sid} holds {st.nbytes()} B, "
                                    f"the plan says {nbytes} B")
            raw[offset:offset + nbytes].copy_(byte_view(st))
            offset += nbytes
        return out

    def unpack(self, carrier: torch.Tensor, backward: bool) -> list[Any]:
        """The storages ``carrier`` packed (forward or ``backward`` direction), fresh copies of its bytes. Backward,
        each is a callable making it (:func:`trainplan.pipeline.split.take` calls it at the plan's receive event, so
        that it is held from there, as the plan counts it), and a ``reduced`` storage None (the receiving stage reads
        zeros in its place: ``PlanCompiler``'s ``zero_stand_ins``)."""
        raw = carrier.detach().view(torch.uint8)
        out: list[Any] = []
        offset = 0
        for sid, nbytes in self.backward if backward else self.forward:
            if backward and sid in self.reduced:
                out.append(None)
                continue
            part = raw[offset:offset + nbytes]
            out.append(partial(_copy, part) if backward else _copy(part))
            offset += nbytes
        return out


def _copy(raw: torch.Tensor) -> torch.UntypedStorage:
    return raw.clone().untyped_storage()
