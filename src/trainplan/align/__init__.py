"""fp16 DMA alignment padding (seed 001): per-op-class padding with fewer bytes than naive, proven by execution.

Typical use::

    from trainplan.align import OpSpec, plan_op
    plan_op(OpSpec("x", "aten._softmax.default", "float16", {"self": (3, 5, 7, 9)}, args={"dim": -1}), 4)
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> submodule; imported on first use (PEP 562), so ``trainplan.align.cli`` (and with it the
#: ``trainplan`` command) does not import torch until an align subcommand runs
_EXPORTS = {"OpSpec": "classes", "build_problem": "classes", "classify": "classes", "resolve": "classes",
            "plan_op": "plan", "totals": "plan", "AlignError": "units", "quantum": "units"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
