"""Facts read off aten op names, without importing torch (the partition, schedule and balance rules do not
load it)."""

from __future__ import annotations

#: aten ops whose result depends on random state: recomputing them would not reproduce the value
RANDOM_OPS = ("aten.rand", "aten.randn", "aten.bernoulli", "aten.native_dropout", "aten.randperm", "aten.randint")


def is_inplace(op: str) -> bool:
    """True for an aten op that mutates an input (``aten.add_.Tensor``, ``aten.copy_.default``)."""
    parts = op.split(".")
    return len(parts) >= 2 and parts[1].endswith("_") and not parts[1].startswith("_")
