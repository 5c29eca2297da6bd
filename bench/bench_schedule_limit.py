"""Benchmark: does `trainplan schedule --time-limit T` return within T + 5% (+ the start-up cost) per method on graphs
up to 5000 ops? The limit is per method: ``--method all`` (ours and every baseline) has one T for each.

Random layered DAGs (Gagrani et al. 2022, Appendix A; ``synthetic.layered_graph``, swap off and on) and synthetic
training graphs (``synthetic.training_graph``), budgets a fraction of the plain topological order's peak. Each
case runs the CLI in a fresh process (as a user or the rule does), once per method (``ours`` and ``all``: every
baseline beside ours); wall time is measured around the process. The start-up cost is the median wall time of
the same command on a two-op problem (interpreter, imports, reading and writing). Every schedule written is
replayed (validity, peak within its budget). Writes bench/results/schedule_limit.md and .csv.

    python bench/bench_schedule_limit.py --sizes 2000 5000 --limits 2 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from host_load import load_label
from trainplan.io import atomic_path, read_json, write_table
from trainplan.schedule import METHODS, replay
from trainplan.schedule.baselines import no_recompute_events
from trainplan.schedule.problem import Op, Problem, save_problem
from trainplan.schedule.synthetic import layered_graph, training_graph

RESULTS = Path(__file__).parent / "results"
TOLERANCE = 1.05  # the promise: T + 5%, plus the start-up cost
GRAPHS = {"layered": lambda n, seed: layered_graph(n, seed, swap=False),
          "layered+swap": lambda n, seed: layered_graph(n, seed, swap=True),
          "training": training_graph}


def run_cli(problem: Path, out: Path, limit: float, method: str) -> float:
    """Wall seconds of one `trainplan schedule` process."""
    cmd = [sys.executable, "-m", "trainplan.cli", "schedule", str(problem), "-o", str(out), "--time-limit",
           str(limit), "--method", method]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def startup_seconds(tmp: Path, repeats: int = 5) -> float:
    """Median wall time of the CLI on a two-op problem: what every call costs before and after its limit."""
    tiny = Problem((Op("a", 1.0, 8), Op("b", 1.0, 8, ("a",))), budget_bytes=64, bandwidth=1e9)
    save_problem(tmp / "tiny.json", tiny)
    return statistics.median(run_cli(tmp / "tiny.json", tmp / "tiny_out.json", 1.0, "ours") for _ in range(repeats))


def check(problem: Problem, out: Path) -> dict:
    """The written schedule(s) replayed: every valid one within its budget; ours' status and budget status."""
    data = read_json(out)
    scheds = [data, *data.get("baselines", {}).values()]
    for s in scheds:
        if s["events"] and s["status"] in ("optimal", "feasible", "raised"):
            r = replay(problem, [tuple(e) for e in s["events"]], s["budget_bytes"])
            assert r.peak_bytes <= s["budget_bytes"], (out, s["method"])
    return {"status": data["status"], "budget_status": data.get("budget_status"),
            "baselines_with_schedule": sum(bool(s["events"]) for s in scheds[1:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 3000, 5000])
    ap.add_argument("--graphs", nargs="+", choices=sorted(GRAPHS), default=sorted(GRAPHS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.8])
    ap.add_argument("--limits", type=float, nargs="+", default=[2.0, 10.0])
    ap.add_argument("--methods", nargs="+", default=["ours", "all"])
    ap.add_argument("--out", default=str(RESULTS / "schedule_limit"), help="output stem (.md and .csv)")
    args = ap.parse_args()
    start, rows, loads = time.time(), [], [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        startup = startup_seconds(tmp)
        for kind in args.graphs:
            for n in args.sizes:
                for seed in args.seeds:
                    p = GRAPHS[kind](n, seed)
                    peak = replay(p, no_recompute_events(p)).peak_bytes
                    for frac in args.fractions:
                        prob = p.with_budget(int(frac * peak))
                        src = tmp / "p.json"
                        save_problem(src, prob)
                        for limit in args.limits:
                            for method in args.methods:
                                wall = run_cli(src, tmp / "s.json", limit, method)
                                loads.append(os.getloadavg()[0])
                                allowed = limit * (len(METHODS) if method == "all" else 1)
                                row = {"graph": kind, "n": n, "seed": seed, "fraction": frac, "limit_s": limit,
                                       "method": method, "wall_s": wall, "startup_s": startup,
                                       "over_limit": (wall - startup) / allowed,
                                       "within": wall <= TOLERANCE * allowed + startup,
                                       **check(prob, tmp / "s.json")}
                                rows.append(row)
                                print(row, flush=True)
    frame = pd.DataFrame(rows)
    stem = Path(args.out)
    write_table(stem.with_suffix(".csv"), frame)
    shown = frame.assign(wall_s=frame.wall_s.round(2), over_limit=frame.over_limit.round(3)).drop(columns="startup_s")
    text = "\n".join([
        "# Time limit of `trainplan schedule` on large graphs",
        "",
        f"Written by `bench/bench_schedule_limit.py` ({time.time() - start:.0f} s; {load_label(loads)}). Each row is "
        "one CLI process (`--workers 2`, deterministic); `wall_s` is measured around the process, `over_limit` = "
        f"(wall - start-up) / allowed, where the start-up ({startup:.2f} s: the median of 5 runs on a two-op problem) "
        f"is the fixed cost of every call and `allowed` the limit times the methods run; `within`: wall <= {TOLERANCE} "
        "x allowed + start-up. Every schedule written was replayed: valid and within its budget. `all`: ours and every "
        f"baseline in one call, each with the limit ({len(METHODS)} limits in all).",
        "",
        f"Within on {int(frame.within.sum())} of {len(frame)} calls; `over_limit` {frame.over_limit.min():.3f}-"
        f"{frame.over_limit.max():.3f}.",
        "",
        shown.to_markdown(index=False),
        "",
    ])
    with atomic_path(stem.with_suffix(".md")) as tmp_md:
        tmp_md.write_text(text)


if __name__ == "__main__":
    main()
