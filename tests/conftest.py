"""Shared fixtures: tiny real models and their traced, exported graphs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from workflow_run import SHARED_CORES, TINY, snakemake

from trainplan.export.tables import GraphTables, graph_tables
from trainplan.export.trace import TracedStep, trace_training_step
from trainplan.models import BuiltModel, build_model
from trainplan.schedule import mip
from trainplan.schedule.settings import DEFAULTS, PortfolioSettings

TINY_GPT2: dict[str, Any] = {
    "source": "transformers",
    "architecture": "GPT2LMHeadModel",
    "config": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512, "n_positions": 64},
    "inputs": {"batch_size": 2, "seq_len": 16},
}
SMALL_CNN: dict[str, Any] = {"source": "callable", "callable": "trainplan.zoo:small_cnn", "kwargs": {}}
#: three bottleneck blocks (two stages), 32x32 images
TINY_RESNET: dict[str, Any] = {"source": "transformers", "architecture": "ResNetForImageClassification",
                               "config": {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [2, 1],
                                          "layer_type": "bottleneck", "num_labels": 4},
                               "inputs": {"batch_size": 2, "image_size": 32}}


@pytest.fixture(scope="session")
def tiny_gpt2() -> tuple[BuiltModel, TracedStep, list, GraphTables]:
    built = build_model("tiny_gpt2", TINY_GPT2, seed=0)
    traced, flat = trace_training_step(built)
    return built, traced, flat, graph_tables(traced)


@pytest.fixture(scope="session")
def small_cnn() -> tuple[BuiltModel, TracedStep, list, GraphTables]:
    built = build_model("small_cnn", SMALL_CNN, seed=0)
    traced, flat = trace_training_step(built)
    return built, traced, flat, graph_tables(traced)


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory) -> Path:
    """Working directory of the tiny test study (tests/config/config.yaml), run once per session, two jobs at a time
    (SHARED_CORES)."""
    workdir = tmp_path_factory.mktemp("study")
    out = snakemake(workdir, TINY, *SHARED_CORES)
    assert out.returncode == 0, out.stderr[-4000:]
    return workdir


WIDE_WALL_NETS = 10.0  # x: the wall-clock nets fire only on a host ~5x slower than the one the rates were fitted on


@pytest.fixture
def wide_wall_nets(monkeypatch) -> Callable[[PortfolioSettings], PortfolioSettings]:
    """For tests of the scheduler's determinism: widens the wall-clock safety nets of deterministic runs (CP-SAT's
    cap, ``mip.WALL_SAFETY``; the bisection's, ``wall_safety``; the call's deadline, ``deadline_share``) to
    WIDE_WALL_NETS x, so a slow or loaded CI host does not cut a step on the wall clock, where by design the answer
    may change (schedule/mip.py, configure). Returns the function widening the settings it is given (default:
    DEFAULTS); the deterministic budgets (the shares of the limit and the work rates) stay as they are."""
    monkeypatch.setattr(mip, "WALL_SAFETY", WIDE_WALL_NETS)

    def widen(settings: PortfolioSettings = DEFAULTS) -> PortfolioSettings:
        return replace(settings, wall_safety=WIDE_WALL_NETS,
                       deadline_share=WIDE_WALL_NETS * settings.deadline_share / settings.wall_safety)

    return widen
