"""``trainplan fuse GRAPH.json --support TABLE.yaml -o GROUPS.json``: the partitioner on a user's graph."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from trainplan.fuse.errors import FuseError
from trainplan.fuse.graph import graph_from_dict
from trainplan.fuse.partitioner import fuse_graph
from trainplan.fuse.support import resolve_table, support_masks
from trainplan.io import read_json, write_json


def add_parser(sub: argparse._SubParsersAction) -> Callable[[argparse.Namespace], int]:
    """Register the ``fuse`` subcommand; returns its runner."""
    ap = sub.add_parser("fuse", help="fusion groups with one input op and one output op (seed 002)")
    ap.add_argument("graph", help="GRAPH.json: {nodes: [{id, op, supported?, inputs?, outputs?}], edges: [[from, to]]}")
    ap.add_argument("--support", default=None,
                    help="support table YAML (docs/fuse.md), or 'inductor'; without it every node needs 'supported'")
    ap.add_argument("-o", "--output", required=True, help="GROUPS.json to write")
    return run


def run(args: argparse.Namespace) -> int:
    """Read, partition, write; any bad input raises FuseError/ArtifactError before a file is written."""
    graph, pinned = graph_from_dict(read_json(args.graph))
    if args.support is None:
        missing = [graph.names[u] for u in range(graph.n) if pinned[u] is None]
        if missing:
            raise FuseError(f"node '{missing[0]}' has no 'supported' flag and no --support table was given")
        supported, broken = [bool(p) for p in pinned], {}
    else:
        supported, broken = support_masks(graph, resolve_table(args.support), pinned)
    fusion = fuse_graph(graph, supported, broken)
    doc = fusion.to_dict(graph)
    write_json(args.output, doc)
    s = fusion.stats
    print(f"{args.output}: {s['groups']} groups ({s['groups_ge2']} of >= 2 ops) over {s['n_eligible']} of "
          f"{s['n_nodes']} nodes, contracted graph is a DAG, {s['time_s']:.3f} s")
    return 0
