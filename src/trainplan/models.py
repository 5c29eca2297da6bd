"""Build real PyTorch models and one training batch from a config entry (no downloads)."""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Callable

import torch

from trainplan.budget import BudgetError, parse_bytes
from trainplan.errors import ModelSpecError


@dataclass
class BuiltModel:
    """A model in training mode with one batch of keyword inputs and a loss function; ``loss_chunk_bytes``: its
    traced step's language-model loss head chunked to logits of at most that (``trainplan.export.loss_head``)."""

    name: str
    module: torch.nn.Module
    batch: dict[str, torch.Tensor]
    loss_fn: Callable[[Any], torch.Tensor]
    loss_chunk_bytes: int | None = None


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


def _refuse(name: str, what: str, unknown: list[str], options: Iterable[str], owner: str) -> None:
    """ModelSpecError naming the model and the first unknown key of ``what``, with the closest of ``options``."""
    if unknown:
        key = sorted(unknown)[0]
        close = difflib.get_close_matches(key, sorted(options), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ModelSpecError(f"model '{name}': {what} key '{key}' is not an option of {owner}{hint}")


def _config_options(default: Any) -> set[str]:
    """Public names a transformers config understands: a default instance's attributes and properties (GPT-2's
    ``n_layer``, ``num_labels``) and the class's ``attribute_map`` aliases (``num_hidden_layers``)."""
    cls = type(default)
    properties = [key for key in dir(cls) if isinstance(getattr(cls, key, None), property)]
    return {key for key in (*vars(default), *properties, *cls.attribute_map) if not key.startswith("_")}


def transformers_config(name: str, spec: dict[str, Any]) -> tuple[type, Any]:
    """The transformers model class ``spec['architecture']`` and its config built from ``spec['config']``.

    A config class keeps any keyword as an attribute, so a misspelled key would leave the reference size in
    place: a key the config stored that neither a default config nor the generation options (which some
    models read from their config, T5's ``decoder_start_token_id``) know raises ModelSpecError, as do an
    unknown class and a value the config refuses. Keys the config consumes (``attn_implementation``) pass.
    """
    import transformers

    arch = spec.get("architecture")
    model_cls = getattr(transformers, str(arch), None) if arch else None
    if model_cls is None or not hasattr(model_cls, "config_class"):
        raise ModelSpecError(
            f"model '{name}': unknown transformers architecture '{arch}' "
            "(expected a class such as GPT2LMHeadModel or ResNetForImageClassification)"
        )
    config_cls, given = model_cls.config_class, spec.get("config", {})
    try:
        cfg, default = config_cls(**given), config_cls()
    except (TypeError, ValueError) as exc:
        raise ModelSpecError(f"model '{name}': bad config for {arch}: {exc}") from exc
    options = _config_options(default)
    generation = set(vars(transformers.GenerationConfig()))
    stored = [key for key in given if key in vars(cfg) and key not in options | generation]
    _refuse(name, "config", stored, options, config_cls.__name__)
    return model_cls, cfg


def _build_transformers(name: str, spec: dict[str, Any], gen: torch.Generator) -> BuiltModel:
    model_cls, cfg = transformers_config(name, spec)
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    if not spec.get("dropout", False):
        _no_dropout(cfg)
    module = model_cls(cfg)
    batch = _transformers_batch(name, str(spec["architecture"]), cfg, spec.get("inputs", {}), gen)
    return BuiltModel(name, module, batch, default_loss)


def model_factory(name: str, spec: dict[str, Any]) -> Callable[..., Any]:
    """The function ``spec['callable']`` names; a malformed or unimportable name, or a ``kwargs`` key its
    signature has no parameter for (unless it takes ``**kwargs``), raises ModelSpecError."""
    target = str(spec.get("callable", ""))
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ModelSpecError(f"model '{name}': callable must look like 'package.module:function', got '{target}'")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ModelSpecError(f"model '{name}': cannot import callable '{target}': {exc}") from exc
    params = inspect.signature(factory).parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        options = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        _refuse(name, "kwargs", [key for key in spec.get("kwargs", {}) if key not in options], options, target)
    return factory


def _build_callable(name: str, spec: dict[str, Any]) -> BuiltModel:
    target = spec["callable"]
    result = model_factory(name, spec)(**spec.get("kwargs", {}))
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise ModelSpecError(f"model '{name}': callable '{target}' must return (torch.nn.Module, dict of input tensors)")
    module, batch = result
    return BuiltModel(name, module, dict(batch), default_loss)


def _source(name: str, spec: dict[str, Any]) -> str:
    """The entry's ``source``: 'transformers' (the default) or 'callable'; else ModelSpecError."""
    source = spec.get("source", "transformers")
    if source not in ("transformers", "callable"):
        raise ModelSpecError(f"model '{name}': source must be 'transformers' or 'callable', got '{source}'")
    return source


def check_spec(name: str, spec: dict[str, Any]) -> None:
    """What build_model refuses, checked without building the model (the workflow's start-up check): the
    source, the architecture and its config keys, or the callable and its kwargs, and ``loss_chunk``;
    ModelSpecError names them."""
    if _source(name, spec) == "transformers":
        transformers_config(name, spec)
    else:
        model_factory(name, spec)
    loss_chunk_bytes(name, spec)


def loss_chunk_bytes(name: str, spec: dict[str, Any]) -> int | None:
    """The entry's ``loss_chunk`` in bytes (``"64MiB"``), or None; anything but a byte count raises ModelSpecError."""
    value = spec.get("loss_chunk")
    try:
        return None if value is None else parse_bytes(value, "loss_chunk")
    except BudgetError as exc:
        raise ModelSpecError(f"model '{name}': {exc}") from exc


def build_model(name: str, spec: dict[str, Any], seed: int = 0) -> BuiltModel:
    """Build model ``name`` from its config entry with random weights seeded by ``seed``, in training mode."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    if _source(name, spec) == "transformers":
        built = _build_transformers(name, spec, gen)
    else:
        built = _build_callable(name, spec)
    built.module.train()
    built.loss_chunk_bytes = loss_chunk_bytes(name, spec)
    return built


def on_device(built: BuiltModel, device: str | torch.device) -> BuiltModel:
    """``built`` with its module moved to ``device`` (in place, as ``Module.to`` does) and its batch copied
    there. Trace on the device the step will run on: a trace bakes device-specific kernels (the CPU's
    flash-attention op, say) and factory devices (``arange(..., device='cpu')``) into the graph."""
    dev = torch.device(device)
    batch = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in built.batch.items()}
    return BuiltModel(built.name, built.module.to(dev), batch, built.loss_fn, built.loss_chunk_bytes)
