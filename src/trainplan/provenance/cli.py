"""``trainplan publish``: archive a finished study (code, resolved config, results) with its provenance;
``trainplan verify``: check a finished study's results against the sha256 its provenance recorded."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> Callable[[argparse.Namespace], int]:
    """Register ``publish``; returns its runner."""
    ap = sub.add_parser("publish", help="archive a finished study: code, resolved config, results, provenance")
    ap.add_argument("-o", "--output", required=True, help="archive to write (.tar.gz)")
    ap.add_argument("-d", "--directory", default=".", help="study directory (snakemake --directory; default .)")
    ap.add_argument("--repo", default=None, help="git work tree of the workflow code (default: the study directory)")
    return _run


def _run(args: argparse.Namespace) -> int:
    from trainplan.provenance.archive import publish

    members = publish(args.directory, args.repo or args.directory, args.output)
    print(f"{args.output}: {len(members)} files (code, config, results, logs, benchmarks, metadata)")
    return 0


def add_verify_parser(sub: argparse._SubParsersAction) -> Callable[[argparse.Namespace], int]:
    """Register ``verify``; returns its runner."""
    ap = sub.add_parser("verify", help="check a finished study's results against the sha256 in results/provenance.json")
    ap.add_argument("-d", "--directory", default=".", help="study directory (snakemake --directory; default .)")
    return _run_verify


def _run_verify(args: argparse.Namespace) -> int:
    """Exit 0 with one line when every recorded result is intact; else name each damaged or missing file and
    print the command that regenerates them, exit 1."""
    from trainplan.provenance.verify import PROVENANCE, regenerate_command, verify

    record, damaged = verify(args.directory)
    if not damaged:
        print(f"{args.directory}: OK, all {len(record['results'])} result files match {PROVENANCE}")
        return 0
    for name, state in damaged.items():
        print(f"{Path(args.directory) / name}: {state} since {PROVENANCE} was written")
    print(f"{args.directory}: {len(damaged)} of {len(record['results'])} result files damaged or missing; "
          "to regenerate them (and what depends on them), run from the workflow's directory:")
    print(regenerate_command(args.directory, record["config"], list(damaged)))
    return 1
