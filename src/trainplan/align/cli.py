"""``trainplan align OPS.json -o PLAN.json [--granularity 4]``: the padding planner on a file of ops."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def add_parser(sub: argparse._SubParsersAction) -> Callable[[argparse.Namespace], int]:
    """Register the ``align`` subcommand; returns its runner."""
    ap = sub.add_parser("align", help="fp16 DMA alignment padding per op class (seed 001), vs naive padding")
    ap.add_argument("ops", help="OPS.json: {\"ops\": [{\"id\", \"op\", \"shape\", \"dtype\", \"dim\"?}]} (docs/align.md)")
    ap.add_argument("-o", "--output", required=True, help="PLAN.json to write")
    ap.add_argument("--granularity", type=int, default=4, help="DMA granularity in bytes (seed: 4)")
    ap.add_argument("--matmul-rule", choices=["dma", "tensor_core"], default="dma",
                    help="matmuls: dma (seed: rows or columns aligned) or tensor_core (M, K and N aligned)")
    return run


def run(args: argparse.Namespace) -> int:
    """Plan every op, then write the plan (nothing is written when an op is bad)."""
    from trainplan.align.ops_file import plan_ops, read_ops, write_plan

    plan = plan_ops(read_ops(args.ops), args.granularity, args.matmul_rule)
    write_plan(args.output, plan)
    t = plan["totals"]
    print(f"{args.output}: {t['ops']} ops, padded {t['pad_bytes']} B (naive {t['naive_pad_bytes']} B), "
          f"{t['share_aligned_before']:.1%} of tensors already aligned")
    return 0
