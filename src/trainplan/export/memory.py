"""Static, storage-level liveness of an exported graph: fixed bytes and the activation timeline."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

FIXED_KINDS = ("parameter", "buffer", "input", "constant")  # constant: a tensor lifted into the graph (get_attr)


@dataclass
class MemoryProfile:
    """Bytes held while each op runs, for the graph executed in order with frees after last use."""

    fixed_bytes: int
    live_bytes: np.ndarray  # per op (node_id order): non-fixed storage bytes alive while it runs
    peak_bytes: int  # fixed + max(live)
    peak_node: str


def storage_lifetimes(nodes: pd.DataFrame, tensors: pd.DataFrame) -> pd.DataFrame:
    """One row per non-fixed storage: bytes, first op index that allocates it, last op index that uses it."""
    op_index = {name: i for i, name in enumerate(nodes["name"])}
    last = len(nodes) - 1
    rows: dict[int, dict[str, int]] = {}
    fixed = set(tensors.loc[tensors.kind.isin(FIXED_KINDS), "storage"])
    storage_of = dict(zip(tensors.tensor_id, tensors.storage))
    for t in tensors.itertuples():
        if t.storage in fixed or t.node not in op_index:
            continue
        row = rows.setdefault(t.storage, {"storage": t.storage, "bytes": t.storage_bytes, "alloc": op_index[t.node], "free": op_index[t.node]})
        if t.is_graph_output:
            row["free"] = last
    for i, ins in enumerate(nodes["inputs"]):
        for tid in ins:
            row = rows.get(storage_of[tid])
            if row is not None:
                row["free"] = max(row["free"], i)
    return pd.DataFrame(list(rows.values()), columns=["storage", "bytes", "alloc", "free"])


def memory_profile(nodes: pd.DataFrame, tensors: pd.DataFrame) -> MemoryProfile:
    """Liveness of every storage, de-duplicated across aliases; graph outputs live to the end."""
    fixed_storages = tensors.loc[tensors.kind.isin(FIXED_KINDS)].drop_duplicates("storage")
    fixed_bytes = int(fixed_storages.storage_bytes.sum())
    life = storage_lifetimes(nodes, tensors)
    delta = np.zeros(len(nodes) + 1, dtype=np.int64)
    np.add.at(delta, life["alloc"].to_numpy(), life["bytes"].to_numpy())
    np.add.at(delta, life["free"].to_numpy() + 1, -life["bytes"].to_numpy())
    live = np.cumsum(delta)[:-1]
    peak_i = int(np.argmax(live)) if len(live) else 0
    return MemoryProfile(fixed_bytes, live, fixed_bytes + int(live.max(initial=0)), str(nodes["name"].iloc[peak_i]) if len(nodes) else "")
