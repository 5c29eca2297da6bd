"""Realistic overflow cases with random weights: rescale chosen parameters to trained-model magnitudes.

ReLU/GELU feed-forward blocks are (nearly) positively homogeneous, so multiplying ``wi`` by a and ``wo``
by b multiplies the block's output by a*b without changing which directions it writes: the random model
then has the activation magnitudes of a trained checkpoint at those layers (e.g. T5's ``wo`` outputs,
which exceed 65504 in fp16 and are why transformers keeps ``wo`` in fp32).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from trainplan.export.trace import TracedStep, trace_training_step
from trainplan.models import build_model


class ParamScaleError(ValueError):
    """A parameter-scaling rule matches no parameter or has a bad factor."""


@dataclass(frozen=True)
class ParamScale:
    """Multiply every parameter whose dotted name matches ``pattern`` (a regex, searched) by ``factor``."""

    pattern: str
    factor: float


def parse_param_scales(entries: Iterable[dict[str, Any]]) -> list[ParamScale]:
    """Rules from config entries ``{pattern, factor}``."""
    rules = [ParamScale(str(e["pattern"]), float(e["factor"])) for e in entries]
    for r in rules:
        if not r.factor > 0:
            raise ParamScaleError(f"param_scale '{r.pattern}': factor must be > 0, got {r.factor}")
    return rules


def scale_parameters(module: torch.nn.Module, rules: list[ParamScale], model: str = "") -> dict[str, float]:
    """Apply ``rules`` in place; returns the factor applied to each parameter. A rule matching nothing is an error."""
    applied: dict[str, float] = {}
    params = dict(module.named_parameters())
    with torch.no_grad():
        for rule in rules:
            hits = [n for n in params if re.search(rule.pattern, n)]
            if not hits:
                raise ParamScaleError(f"model '{model}': param_scale pattern '{rule.pattern}' matches no parameter")
            for name in hits:
                params[name].mul_(rule.factor)
                applied[name] = applied.get(name, 1.0) * rule.factor
    return applied


def build_case(name: str, spec: dict[str, Any], seed: int, param_scale: Iterable[dict[str, Any]] = ()) -> tuple[TracedStep, list[torch.Tensor], dict[str, float]]:
    """Build model ``name``, apply its parameter scaling, trace its training step.

    Returns the traced step, its real flat inputs and the factor applied to each scaled parameter.
    """
    built = build_model(name, spec, seed=seed)
    applied = scale_parameters(built.module, parse_param_scales(param_scale), name)
    traced, flat = trace_training_step(built)
    return traced, flat, applied
