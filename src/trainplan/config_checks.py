"""The workflow's start-up checks of its config beyond what the schema checks: references between keys, model
entries and the budgets' wildcards. Each failure raises :class:`ConfigError` naming the config key; the
Snakefile reports it as a WorkflowError before any job runs. No torch here (a model entry's check imports it only
when the entry was not checked before: :mod:`trainplan.start_checks`)."""

from __future__ import annotations

from typing import Any

from trainplan.budget import BudgetError, budget_wildcard, wildcard_budget
from trainplan.errors import ModelSpecError
from trainplan.start_checks import CheckRecord, check_models


class ConfigError(ValueError):
    """A config that the schema accepts but the workflow cannot run; the message names the key."""


def config_devices(config: dict[str, Any]) -> list[str]:
    """The study's devices: ``device`` is one name or a list of them (a sweep over devices)."""
    return [config["device"]] if isinstance(config["device"], str) else list(config["device"])


def check_config(config: dict[str, Any], record: CheckRecord) -> None:
    """Every device and study model the config names is defined, every model entry builds with the keys it gives
    (typos are not ignored: ``trainplan.models.check_spec``), and fused models are planned on the CPU only."""
    devices = config_devices(config)
    for device in devices:
        if device not in config["devices"]:
            raise ConfigError(f"config key 'device': '{device}' is not one of devices {sorted(config['devices'])}")
    for part, names in config["study"].items():
        for name in names:
            if name not in config["models"]:
                raise ConfigError(f"config key 'study.{part}': model '{name}' is not defined under 'models' "
                                  f"(defined: {sorted(config['models'])})")
    try:
        check_models(config["models"], record)
    except ModelSpecError as exc:
        raise ConfigError(f"config: {exc}") from None
    cuda = [device for device in devices if config["devices"][device]["type"] != "cpu"]
    if config["fuse"]["plan"] and config["study"]["plan"] and cuda:
        raise ConfigError(f"config key 'fuse.plan': fused models are built on the CPU (their ops compiled there); "
                          f"device '{cuda[0]}' is {config['devices'][cuda[0]]['type']}: set fuse.plan: []")


def budget_wildcards(entries: list[Any]) -> list[str]:
    """The ``{budget}`` wildcard of each ``budgets`` entry (``b0.5``, ``b2GiB``:
    :func:`trainplan.budget.budget_wildcard`); an entry that is no budget, or one that repeats another, names its
    index."""
    wildcards: dict[Any, str] = {}
    for i, entry in enumerate(entries):
        try:
            text = budget_wildcard(entry)
        except BudgetError as exc:
            raise ConfigError(f"config key 'budgets[{i}]': {exc}") from None
        budget = wildcard_budget(text)
        if budget in wildcards:
            raise ConfigError(f"config key 'budgets[{i}]': budget {entry!r} repeats b{wildcards[budget]}")
        wildcards[budget] = text
    return list(wildcards.values())
