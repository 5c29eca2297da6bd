"""Artifact paths of the overflow stage and the checkpoint walk Snakemake's input functions use."""

from __future__ import annotations

from typing import Any

from trainplan.io import read_json


def iteration_dir(model: str, i: int) -> str:
    """Folder of pass ``i`` of ``model``."""
    return f"results/overflow/{model}/iter{i}"


def iteration_inputs(model: str, i: int, start_policy: str) -> dict[str, str]:
    """Inputs of pass ``i``: the configured policy at pass 0, else the previous pass's policy and findings."""
    if i == 0:
        return {"policy": start_policy}
    previous = iteration_dir(model, i - 1)
    return {"policy": f"{previous}/policy_next.yaml", "previous": f"{previous}/findings.json"}


def walk_iterations(checkpoint: Any, model: str, cap: int) -> list[str]:
    """Findings of every pass up to the first converged one, at most ``cap``.

    ``checkpoint`` is ``checkpoints.overflow_iteration``: ``get`` raises Snakemake's incomplete-checkpoint
    signal for a pass not yet run, so the DAG grows one pass at a time.
    """
    files = []
    for i in range(cap):
        findings = checkpoint.get(model=model, i=i).output.findings
        files.append(findings)
        if read_json(findings, schema="findings")["converged"]:
            break
    return files


def final_policy(findings: str) -> str:
    """Policy written beside a pass's findings (the policy after its roots were denied)."""
    return findings.replace("findings.json", "policy_next.yaml")
