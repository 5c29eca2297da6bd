"""Granularity arithmetic: how many elements of a dtype make a DMA-aligned count."""

from __future__ import annotations

import math

import torch

#: dtypes a plan accepts (name -> torch dtype); the element size comes from torch.
DTYPES = {name: getattr(torch, name) for name in ("float16", "bfloat16", "float32", "float64")}


class AlignError(ValueError):
    """Bad alignment input: unknown op or dtype, bad shape or argument; the message names the op."""


def element_size(dtype: str, where: str = "") -> int:
    """Bytes per element of a dtype name (``float16`` -> 2)."""
    if dtype not in DTYPES:
        raise AlignError(f"{where}unknown dtype '{dtype}' (known: {sorted(DTYPES)})")
    return torch.empty((), dtype=DTYPES[dtype]).element_size()


def quantum(granularity_bytes: int, elsize: int) -> int:
    """Smallest element count q whose bytes are a multiple of the granularity (g=4, fp16 -> 2: even counts)."""
    if granularity_bytes < 1:
        raise AlignError(f"granularity must be a positive number of bytes, got {granularity_bytes}")
    return granularity_bytes // math.gcd(granularity_bytes, elsize)


def round_up(n: int, q: int) -> int:
    """n rounded up to a multiple of q."""
    return -(-n // q) * q
