"""Build real PyTorch models and one training batch from a config entry (no downloads)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch


class ModelSpecError(ValueError):
    """A model entry in the config cannot be built; the message names the model and the key."""


@dataclass
class BuiltModel:
    """A model in training mode with one batch of keyword inputs and a loss function."""

    name: str
    module: torch.nn.Module
    batch: dict[str, torch.Tensor]
    loss_fn: Callable[[Any], torch.Tensor]


def default_loss(output: Any) -> torch.Tensor:
    """Loss of a model output: its ``.loss``, a scalar output as is, else the mean square of its first tensor."""
    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    if isinstance(output, (tuple, list)):
        output = output[0]
    if isinstance(output, torch.Tensor) and output.dim() == 0:
        return output
    if isinstance(output, dict):
        output = next(iter(output.values()))
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"cannot derive a loss from model output of type {type(output).__name__}")
    return output.float().pow(2).mean()


def _no_dropout(cfg: Any) -> None:
    for key, value in list(vars(cfg).items()):
        if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
            setattr(cfg, key, 0.0)


def _transformers_batch(name: str, arch: str, cfg: Any, inputs: dict[str, Any], gen: torch.Generator) -> dict[str, torch.Tensor]:
    batch_size = int(inputs.get("batch_size", 2))
    kind = inputs.get("type") or ("image" if "Image" in arch else "text")
    if kind == "image":
        size = int(inputs.get("image_size", getattr(cfg, "image_size", 224)))
        channels = int(getattr(cfg, "num_channels", 3))
        pixels = torch.randn(batch_size, channels, size, size, generator=gen)
        labels = torch.randint(0, int(getattr(cfg, "num_labels", 2)), (batch_size,), generator=gen)
        return {"pixel_values": pixels, "labels": labels}
    if kind != "text":
        raise ModelSpecError(f"model '{name}': inputs.type must be 'text' or 'image', got '{kind}'")
    seq_len = int(inputs.get("seq_len", 128))
    ids = torch.randint(0, int(cfg.vocab_size), (batch_size, seq_len), generator=gen)
    if "SequenceClassification" in arch:
        labels = torch.randint(0, int(getattr(cfg, "num_labels", 2)), (batch_size,), generator=gen)
    else:
        labels = ids.clone()
    return {"input_ids": ids, "labels": labels}


def _build_transformers(name: str, spec: dict[str, Any], gen: torch.Generator) -> BuiltModel:
    import transformers

    arch = spec.get("architecture")
    model_cls = getattr(transformers, str(arch), None) if arch else None
    if model_cls is None or not hasattr(model_cls, "config_class"):
        raise ModelSpecError(
            f"model '{name}': unknown transformers architecture '{arch}' "
            "(expected a class such as GPT2LMHeadModel or ResNetForImageClassification)"
        )
    try:
        cfg = model_cls.config_class(**spec.get("config", {}))
    except (TypeError, ValueError) as exc:
        raise ModelSpecError(f"model '{name}': bad config for {arch}: {exc}") from exc
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    if not spec.get("dropout", False):
        _no_dropout(cfg)
    module = model_cls(cfg)
    batch = _transformers_batch(name, str(arch), cfg, spec.get("inputs", {}), gen)
    return BuiltModel(name, module, batch, default_loss)


def _build_callable(name: str, spec: dict[str, Any]) -> BuiltModel:
    target = str(spec.get("callable", ""))
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ModelSpecError(f"model '{name}': callable must look like 'package.module:function', got '{target}'")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ModelSpecError(f"model '{name}': cannot import callable '{target}': {exc}") from exc
    result = factory(**spec.get("kwargs", {}))
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise ModelSpecError(f"model '{name}': callable '{target}' must return (torch.nn.Module, dict of input tensors)")
    module, batch = result
    return BuiltModel(name, module, dict(batch), default_loss)


def build_model(name: str, spec: dict[str, Any], seed: int = 0) -> BuiltModel:
    """Build model ``name`` from its config entry with random weights seeded by ``seed``, in training mode."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    source = spec.get("source", "transformers")
    if source == "transformers":
        built = _build_transformers(name, spec, gen)
    elif source == "callable":
        built = _build_callable(name, spec)
    else:
        raise ModelSpecError(f"model '{name}': source must be 'transformers' or 'callable', got '{source}'")
    built.module.train()
    return built


def on_device(built: BuiltModel, device: str | torch.device) -> BuiltModel:
    """``built`` with its module moved to ``device`` (in place, as ``Module.to`` does) and its batch copied
    there. Trace on the device the step will run on: a trace bakes device-specific kernels (the CPU's
    flash-attention op, say) and factory devices (``arange(..., device='cpu')``) into the graph."""
    dev = torch.device(device)
    batch = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in built.batch.items()}
    return BuiltModel(built.name, built.module.to(dev), batch, built.loss_fn)
