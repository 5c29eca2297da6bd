"""The exported tables with each in-place embedding gradient sum made functional, as a pipeline runs them.

``trainplan::embedding_grad_add_`` (``export.embedding_grads``) writes the embedding's rows into the weight's other
gradient. A pipeline stage never writes into a storage another stage makes (a tied weight's partial gradient is
received as zeros, ``trainplan.pipeline.tied``), so pipelines trace the step with the functional sum
(``trace_training_step(..., sums_in_place=False)``) and plan on these tables: equal to that trace's, storage ids
included (ids number storages in order of first appearance, as ``export.tables`` does). Without torch: the
partition and balance rules use it.
"""

from __future__ import annotations

import pandas as pd

from trainplan.aten_ops import FUNCTIONAL_SUM, IN_PLACE_SUM


def functional_sum_tables(nodes: pd.DataFrame, tensors: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``nodes`` and ``tensors`` as the step traced with functional sums tabulates them (the same frames when the
    step has no in-place sum): each sum's output on a new storage of its own bytes, later storages renumbered."""
    sums = nodes["op"] == IN_PLACE_SUM
    if not sums.any():
        return nodes, tensors
    nodes, tensors = nodes.copy(), tensors.copy()
    names = set(nodes.loc[sums, "name"])
    out = tensors["node"].isin(names).to_numpy()
    storage = tensors["storage"].astype(object)
    storage[out] = [("sum", tid) for tid in tensors.loc[out, "tensor_id"]]  # a storage of its own
    tensors["storage"] = pd.factorize(storage)[0].astype(tensors["storage"].dtype)
    tensors.loc[out, "storage_bytes"] = tensors.loc[out, "bytes"]
    made = tensors.loc[out].groupby("node")["bytes"].sum()
    nodes.loc[sums, "op"] = FUNCTIONAL_SUM
    if "alloc_bytes" in nodes:
        nodes.loc[sums, "alloc_bytes"] = nodes.loc[sums, "name"].map(made).astype(nodes["alloc_bytes"].dtype)
    if "is_view" in nodes:
        nodes.loc[sums, "is_view"] = False
    return nodes, tensors
