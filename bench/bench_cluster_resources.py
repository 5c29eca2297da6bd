"""Per-rule resources measured by a finished study: max RSS and wall time from Snakemake's benchmark files,
the basis of the SLURM profile's mem_mb and runtime (profiles/slurm/config.yaml, docs/cluster.md).

    python bench/bench_cluster_resources.py STUDY_DIR [STUDY_DIR ...] --label "tiny study, under load"

Appends one table per study to bench/results/cluster_resources.md (and prints it).
"""

from __future__ import annotations

import argparse
import platform
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

OUT = Path(__file__).resolve().parent / "results" / "cluster_resources.md"


def rule_table(study: Path) -> pd.DataFrame:
    """Rule -> jobs, largest max RSS (MB), largest and median wall time (s) over the study's benchmarks."""
    rows = []
    for tsv in sorted((study / "benchmarks").rglob("*.tsv")):
        frame = pd.read_csv(tsv, sep="\t")
        rule = tsv.relative_to(study / "benchmarks").parts[0]
        rows.append({"rule": rule, "max_rss_mb": float(frame["max_rss"].max()), "s": float(frame["s"].median())})
    table = pd.DataFrame(rows)
    return table.groupby("rule").agg(jobs=("s", "size"), max_rss_mb=("max_rss_mb", "max"),
                                     s_max=("s", "max"), s_median=("s", "median")).reset_index()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("studies", nargs="+", type=Path)
    ap.add_argument("--label", required=True, help="what was run and the machine's state (e.g. 'under load')")
    args = ap.parse_args()
    lines = []
    for study in args.studies:
        table = rule_table(study)
        lines += [f"## {args.label}: {study}", "",
                  f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
                  f"{len(table)} rules; max RSS is the largest job's, wall time in seconds.", "",
                  table.to_markdown(index=False, floatfmt=".1f"), ""]
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("a") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
