"""The exported training step (results/export/{model}/{backend}/) as an OpGraph."""

from __future__ import annotations

import ast

import pandas as pd

from trainplan.fuse.graph import OpGraph, TensorInfo, build_graph

#: The graph's outputs (loss and gradients) as one host node every producer of a graph output feeds, so a
#: group that computes one of them has it as an output op. fx names cannot contain '<'.
OUTPUT = "<output>"


def graph_from_export(nodes: pd.DataFrame, tensors: pd.DataFrame) -> OpGraph:
    """Ops of ``nodes.parquet`` joined by their data edges between ops (placeholders are graph inputs, not
    ops), with the shapes and dtypes of ``tensors.parquet``, plus the ``OUTPUT`` node."""
    info = {row.tensor_id: TensorInfo(tuple(ast.literal_eval(row.shape)), row.dtype)
            for row in tensors[["tensor_id", "shape", "dtype"]].itertuples(index=False)}
    ops = set(nodes["name"])
    edges = [(src, row.name) for row in nodes[["name", "input_nodes"]].itertuples(index=False)
             for src in dict.fromkeys(row.input_nodes) if src in ops]
    produced = tensors.loc[tensors["is_graph_output"].astype(bool), "node"]
    edges += [(name, OUTPUT) for name in dict.fromkeys(produced) if name in ops]
    ins = [[info[t] for t in ts] for ts in nodes["inputs"]] + [[]]
    outs = [[info[t] for t in ts] for ts in nodes["outputs"]] + [[]]
    return build_graph([*nodes["name"], OUTPUT], [*nodes["op"], "output"], edges, ins, outs)
