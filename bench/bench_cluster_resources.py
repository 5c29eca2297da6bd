"""Per-rule resources measured by a finished study: max RSS and wall time from Snakemake's benchmark files,
the basis of the SLURM profile's mem_mb and runtime (profiles/slurm/config.yaml, docs/cluster.md).

    python bench/bench_cluster_resources.py STUDY_DIR --label "default study, alone" [--csv NAME.csv]

Each benchmark file is matched to its rule by the `benchmark:` patterns of workflow/rules/*.smk (so `layout`
and `layout_measure`, or `align` and `align_prove`, are told apart) and to its model wildcard. Appends one table
per study to bench/results/cluster_resources.md (and prints it); ``--csv`` also writes one row per job to
bench/results/NAME.csv (rule, model, max_rss_mb, s), which tests/test_slurm_profile.py checks the profile against.
"""

from __future__ import annotations

import argparse
import platform
import re
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from trainplan.io import atomic_path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "cluster_resources.md"
RULE = re.compile(r"^(?:rule|checkpoint)\s+(\w+):\n(.*?)(?=^\S|\Z)", re.M | re.S)
BENCHMARK = re.compile(r'benchmark:\s*"([^"]+)"')


def benchmark_patterns(rules_dir: Path = ROOT / "workflow" / "rules") -> dict[str, re.Pattern[str]]:
    """Rule name -> regex of its benchmark path (wildcards as named groups), for every rule with a benchmark."""
    patterns = {}
    for smk in sorted(rules_dir.glob("*.smk")):
        for name, body in RULE.findall(smk.read_text()):
            found = BENCHMARK.search(body)
            if found:
                parts = re.split(r"\{(\w+)\}", found.group(1))
                regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts))
                patterns[name] = re.compile(regex + r"\Z")
    return patterns


def job_table(study: Path) -> pd.DataFrame:
    """One row per benchmark file of the study: rule, model wildcard (or ''), max RSS (MB), wall time (s)."""
    patterns = benchmark_patterns()
    rows = []
    for tsv in sorted((study / "benchmarks").rglob("*.tsv")):
        rel = tsv.relative_to(study).as_posix()
        hits = [(rule, m) for rule, pat in patterns.items() if (m := pat.match(rel))]
        if len(hits) != 1:
            raise SystemExit(f"{rel}: matches {len(hits)} rules' benchmark patterns ({[r for r, _ in hits]})")
        rule, match = hits[0]
        frame = pd.read_csv(tsv, sep="\t")
        rows.append({"rule": rule, "model": match.groupdict().get("model", ""),
                     "max_rss_mb": float(frame["max_rss"].max()), "s": float(frame["s"].median())})
    return pd.DataFrame(rows)


def rule_table(jobs: pd.DataFrame) -> pd.DataFrame:
    """Rule -> jobs, largest max RSS (MB) and its model, largest and median wall time (s)."""
    heaviest = jobs.loc[jobs.groupby("rule")["max_rss_mb"].idxmax(), ["rule", "model"]].rename(
        columns={"model": "heaviest_model"})
    table = jobs.groupby("rule").agg(jobs=("s", "size"), max_rss_mb=("max_rss_mb", "max"),
                                     s_max=("s", "max"), s_median=("s", "median")).reset_index()
    return table.merge(heaviest, on="rule")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", type=Path)
    ap.add_argument("--label", required=True, help="what was run and the machine's state (e.g. 'under load')")
    ap.add_argument("--csv", help="also write one row per job to bench/results/CSV")
    args = ap.parse_args()
    jobs = job_table(args.study)
    table = rule_table(jobs)
    text = "\n".join([f"## {args.label}: {args.study}", "",
                      f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, {len(table)} rules; max RSS "
                      "is the largest job's (`heaviest_model`), wall time in seconds.", "",
                      table.to_markdown(index=False, floatfmt=".1f"), ""]) + "\n"
    print(text)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("a") as handle:
        handle.write(text)
    if args.csv:
        with atomic_path(OUT.parent / args.csv) as tmp:
            jobs.to_csv(tmp, index=False)


if __name__ == "__main__":
    main()
