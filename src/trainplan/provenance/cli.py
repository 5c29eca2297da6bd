"""``trainplan publish``: archive a finished study (code, resolved config, results) with its provenance."""

from __future__ import annotations

import argparse
from collections.abc import Callable


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
