"""Numerics of the measured steps: fp32 as written, with deterministic kernels, on every device."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def exact_fp32() -> Iterator[None]:
    """Run the block with TF32 off for matmuls and convolutions and cuDNN limited to deterministic, unbenchmarked
    algorithms; restore the previous settings after.

    On CUDA, cuDNN's default TF32 convolutions and its atomics-based backward kernels made two runs of the
    same ResNet-50 step differ by 0.7% in a gradient, so a plan could not be held to fp32 round-off. The
    profile and the validation both run under this, so predicted and measured times see the same kernels.
    No effect on the CPU.
    """
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark)
    matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark = False, False, True, False
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark = saved


#: recorded in the profile and validation artifacts
EXACT_FP32 = "tf32 off, cudnn deterministic, cudnn benchmark off"
