"""Facts read off aten op names, without importing torch (the partition, schedule and balance rules do not
load it)."""

from __future__ import annotations


def is_inplace(op: str) -> bool:
    """True for an aten op that mutates an input (``aten.add_.Tensor``, ``aten.copy_.default``)."""
    parts = op.split(".")
    return len(parts) >= 2 and parts[1].endswith("_") and not parts[1].startswith("_")
