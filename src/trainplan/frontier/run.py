"""Run a frontier: each method in fresh processes (:mod:`trainplan.frontier.worker`), summarized per method,
with each competitor's point checked against ours."""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainplan.frontier import worker
from trainplan.frontier.method_names import Method

#: glibc's malloc returns freed memory to the system from the first allocation on, so the process meter tracks
#: the bytes the step holds (trainplan.timing.return_freed_memory sets the same once the process runs)
_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


@dataclass(frozen=True)
class FrontierSettings:
    repeats: int = 5  # measured steps per process
    warmup: int = 2
    processes: int = 1  # fresh processes per method
    threads: int = 2
    time_limit_s: float = 30.0  # a plan's solver, and the exact knapsack's
    seed: int = 0


def run_method(model: str, spec: dict[str, Any], method: str, settings: FrontierSettings, cache: Path) -> list[dict[str, Any]]:
    """One result per process for ``method`` on ``model`` (its config entry ``spec``); a failed process gives
    ``{"error": the last lines it printed}``."""
    payload = json.dumps({"model": model, "spec": spec, "method": str(Method.parse(method)), "cache": str(cache),
                          **asdict(settings)})
    runs = []
    for _ in range(settings.processes):
        out = subprocess.run([sys.executable, "-m", worker.__name__, payload], capture_output=True, text=True,
                             env={**os.environ, **_ENV})
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith(worker.RESULT)), None)
        if out.returncode != 0 or line is None:
            tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
            runs.append({"model": model, "method": method, "error": " | ".join(tail)})
        else:
            runs.append(json.loads(line.removeprefix(worker.RESULT)))
    return runs


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row per (model, method): medians over every step of every process, with the min-max spread."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"model": runs[0]["model"], "method": runs[0]["method"], "error": runs[0]["error"]}
    first = ok[0]
    steps = [s for r in ok for s in r["step_s"]]
    peaks = [p for r in ok for p in r["peak_bytes"]]
    row = {"model": first["model"], "method": first["method"], "peak_mib": statistics.median(peaks) / 2**20,
           "peak_min_mib": min(peaks) / 2**20, "peak_max_mib": max(peaks) / 2**20,
           "step_s": statistics.median(steps), "step_min_s": min(steps), "step_max_s": max(steps),
           "setup_s": statistics.median(r["setup_s"] for r in ok), "loss": first["losses"][0], "processes": len(ok),
           "failed_processes": len(runs) - len(ok)}
    backward = [p for r in ok for p in r["backward_peak_bytes"]]
    row["backward_peak_mib"] = statistics.median(backward) / 2**20
    if "planned_budget_bytes" in first:  # a plan's budget counts the held bytes too; its worst step against it:
        budgeted = peaks if Method.parse(first["method"]).optimizer_in_plan else backward  # what the plan covers
        row["over_budget_mib"] = (first["held_bytes"] + max(budgeted) - first["planned_budget_bytes"]) / 2**20
    for key in ("planned_budget_bytes", "predicted_peak_bytes", "predicted_step_s", "plan_status", "sac", "fused_groups",
                "fused_ops", "unfused_groups"):
        if key in first:
            row[key] = json.dumps(first[key]) if isinstance(first[key], dict) else first[key]
    return row


def verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each competitor's point: the first of ours (same model) with measured peak and step time both <=
    it, or None: ``{"model", "method", "peak_mib", "step_s", "dominated_by"}``."""
    measured = [r for r in rows if "error" not in r]
    ours = [r for r in measured if Method.parse(r["method"]).ours]
    out = []
    for r in measured:
        if Method.parse(r["method"]).ours:
            continue
        win = next((o["method"] for o in ours if o["model"] == r["model"] and o["peak_mib"] <= r["peak_mib"]
                    and o["step_s"] <= r["step_s"]), None)
        out.append({"model": r["model"], "method": r["method"], "peak_mib": r["peak_mib"], "step_s": r["step_s"],
                    "dominated_by": win})
    return out


def run_frontier(model: str, spec: dict[str, Any], methods: list[str], settings: FrontierSettings,
                 log: logging.Logger) -> list[dict[str, Any]]:
    """One summarized row per method, methods in order, plans made once in a cache private to this run (so
    ``sac@F`` reuses ``trainplan@F``'s plan and nothing outside the run is read)."""
    for method in methods:
        Method.parse(method)  # fail before any process starts, naming the method
    rows = []
    with tempfile.TemporaryDirectory(prefix="trainplan-frontier-") as cache:
        for i, method in enumerate(methods, 1):
            rows.append(summarize(run_method(model, spec, method, settings, Path(cache))))
            row = rows[-1]
            log.info("[%d/%d] %s %s: %s", i, len(methods), model, method, row.get("error") or
                     f"peak {row['peak_mib']:.1f} MiB, step {row['step_s']:.3f} s, setup {row['setup_s']:.1f} s")
    return rows
