"""Fusion partitioning (seed 002): groups of supported ops with one input op and one output op."""

from trainplan.fuse.errors import FuseError
from trainplan.fuse.graph import OpGraph, TensorInfo, build_graph, graph_from_dict
from trainplan.fuse.partitioner import Fusion, Group, fuse_graph
from trainplan.fuse.support import SupportTable, inductor_table, load_table, resolve_table, support_masks

__all__ = [
    "FuseError", "Fusion", "Group", "OpGraph", "SupportTable", "TensorInfo", "build_graph", "fuse_graph",
    "graph_from_dict", "inductor_table", "load_table", "resolve_table", "support_masks",
]
