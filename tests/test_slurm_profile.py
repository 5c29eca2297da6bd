"""The SLURM profile (profiles/slurm/config.yaml) against the workflow's rules and the resources the default
study measured (bench/results/cluster_resources_default.csv, written by bench/bench_cluster_resources.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PROFILE = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
MEASURED = pd.read_csv(REPO / "bench" / "results" / "cluster_resources_default.csv", keep_default_na=False)
MEMORY_HEADROOM = 1.25  # mem_mb at the first attempt over the largest max RSS measured
TIME_HEADROOM = 2.0  # runtime over the largest wall time measured (the study ran up to 8 jobs on 2 cores)


def resource(rule: str, name: str, model: str, attempt: int = 1) -> float:
    """A rule's resource as Snakemake evaluates the profile's expression (names: wildcards, attempt, threads)."""
    expr = PROFILE["set-resources"].get(rule, {}).get(name, PROFILE["default-resources"][name])
    return eval(str(expr), {"wildcards": SimpleNamespace(model=model), "attempt": attempt, "threads": 2})


def test_every_rule_the_profile_names_exists():
    out = subprocess.run([sys.executable, "-m", "snakemake", "--list-rules"], cwd=REPO, capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    rules = set(out.stdout.split())
    assert set(PROFILE["set-resources"]) <= rules, set(PROFILE["set-resources"]) - rules


@pytest.mark.parametrize("row", list(MEASURED.itertuples(index=False)), ids=lambda r: f"{r.rule}-{r.model}")
def test_the_first_attempt_covers_the_measured_default_study(row):
    assert resource(row.rule, "mem_mb", row.model) >= MEMORY_HEADROOM * row.max_rss_mb
    assert resource(row.rule, "runtime", row.model) * 60 >= TIME_HEADROOM * row.s


@pytest.mark.parametrize("rule", sorted(PROFILE["set-resources"]))
def test_a_retry_doubles_memory_and_time(rule):
    for model in ("gpt2", "vgg11", "tiny_gpt2"):
        for name in ("mem_mb", "runtime"):
            assert resource(rule, name, model, attempt=2) == 2 * resource(rule, name, model)
