"""The pipeline view of a training graph: ops in topological order, each tied to a forward position.

A pipeline stage is a contiguous range of the FORWARD op sequence plus the backward ops that belong
to it. Every op gets a *key*, the forward position whose stage it joins, so that any contiguous split
of the forward sequence fixes the stage of every op:

1. a forward op: its own position in the forward sequence (topological order);
2. a backward op that reads activations (outputs of forward ops): let g be the smallest key of its
   backward producers (where its incoming gradient comes from). Each activation a it reads is held in
   forward by its producer's stage and by the stages of its forward readers (they received it); take
   h(a) = the largest of those holder positions below g (the forward op it differentiates runs before
   the op whose backward sent the gradient), or the producer's position when none is below g or the op
   reads no gradient (a gradient from a producer placed only by rule 4, such as the loss seed, counts
   as coming from position n_forward, the end). The key is max_a h(a). So the weight gradient of the
   first op of a stage, which reads only the activation that stage received, stays in that stage, and
   an op differentiating a producer (relu's backward reads relu's output) stays with the producer;
3. otherwise, a backward op that reads tensors of backward producers: the smallest key among those
   producers, so gradients only flow from stage s+1 to stage s;
4. otherwise (it reads only parameters, buffers, the batch, or nothing): the largest key among its
   consumers (resolved in reverse order); with no consumer, the last position (where backward starts).

Keys depend on positions only, so stage(op) = the stage whose forward range holds key(op), for every
partition: stage costs are sums over key ranges, which makes the exact DP and the O(1) move checks
possible.

A cut may not fall right before a forward op that makes no storage of its own from a non-fixed storage it reads
(a view, a ``getitem`` of a multi-output op, an in-place update): such an op stays in the stage of the op before
it, so a kernel, its outputs and their views are never split between stages (``cut_ok``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainplan.export.memory import FIXED_KINDS
from trainplan.partition.errors import PartitionError

NODE_COLUMNS = ("name", "phase", "inputs", "outputs", "time_s")
TENSOR_COLUMNS = ("tensor_id", "node", "storage", "storage_bytes", "kind")
PHASES = ("forward", "backward")


@dataclass(frozen=True)
class Reads:
    """(storage, key) pairs: storage index ``storage[i]`` is read by an op keyed ``key[i]`` (unique pairs)."""

    storage: np.ndarray
    key: np.ndarray


@dataclass(frozen=True)
class PipelineGraph:
    """Ops in topological order with their forward keys, times and the storages they exchange."""

    names: tuple[str, ...]  # op names, topological order (ties broken by table order)
    forward: np.ndarray  # bool per op
    key: np.ndarray  # forward position per op
    time: np.ndarray  # profiled seconds per op
    n_forward: int
    storage_bytes: np.ndarray  # per non-fixed storage
    producer_key: np.ndarray  # key of the op allocating each non-fixed storage
    activation: np.ndarray  # bool per non-fixed storage: allocated by a forward op
    fixed_bytes: np.ndarray  # per fixed storage (parameters, buffers, batch)
    reads: Reads  # non-fixed storages by reader key
    stash_reads: Reads  # activation storages by the keys of their backward readers
    fixed_reads: Reads  # fixed storages by reader key
    neighbour_lo: np.ndarray  # per forward position: smallest key of a producer/consumer of its ops
    neighbour_hi: np.ndarray  # per forward position: largest such key
    cut_ok: np.ndarray  # bool per cut position 0..n_forward: a stage may start there (see the module docstring)

    @property
    def n(self) -> int:
        return len(self.names)

    def position_weights(self, weights: np.ndarray) -> np.ndarray:
        """Sum of per-op ``weights`` at each forward position (the cost an op adds to its key's stage)."""
        return np.bincount(self.key, weights=weights, minlength=self.n_forward)


def _check_columns(frame: pd.DataFrame, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise PartitionError(f"{what} table lacks column(s) {missing}")


def _topological_order(names: list[str], preds: list[set[int]]) -> list[int]:
    """Kahn's algorithm, smallest table index first; a cycle raises naming the nodes on it."""
    succs: list[list[int]] = [[] for _ in names]
    indegree = [len(p) for p in preds]
    for v, ps in enumerate(preds):
        for u in ps:
            succs[u].append(v)
    ready = [v for v, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        u = heapq.heappop(ready)
        order.append(u)
        for v in succs[u]:
            indegree[v] -= 1
            if indegree[v] == 0:
                heapq.heappush(ready, v)
    if len(order) < len(names):
        raise PartitionError(f"graph has a cycle through node(s) {_cycle(names, preds, set(order))}")
    return order


def _cycle(names: list[str], preds: list[set[int]], done: set[int]) -> str:
    """Names on one cycle among the nodes Kahn's algorithm could not order."""
    v = next(i for i in range(len(names)) if i not in done)
    seen: dict[int, int] = {}
    path: list[int] = []
    while v not in seen:
        seen[v] = len(path)
        path.append(v)
        v = next(u for u in sorted(preds[v]) if u not in done)
    loop = path[seen[v]:] + [v]  # each reads the next: reverse it to follow the data flow
    return " -> ".join(repr(names[u]) for u in reversed(loop))


def _reads(pairs: set[tuple[int, int]]) -> Reads:
    arr = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
    return Reads(arr[:, 0], arr[:, 1])


def pipeline_graph(nodes: pd.DataFrame, tensors: pd.DataFrame) -> PipelineGraph:
    """Validate a profiled graph (docs/artifacts.md tables) and build its pipeline view.

    Raises PartitionError for a dangling edge (an unknown tensor or producer), a cycle, an unknown
    phase, a forward op reading a backward result, or a graph without forward ops.
    """
    _check_columns(nodes, NODE_COLUMNS, "nodes")
    _check_columns(tensors, TENSOR_COLUMNS, "tensors")
    names = [str(x) for x in nodes["name"]]
    index = {name: i for i, name in enumerate(names)}
    fixed_tensor = dict(zip(tensors.tensor_id, tensors.kind.isin(FIXED_KINDS)))
    producer_of = dict(zip(tensors.tensor_id, tensors.node))
    for row in nodes.itertuples():
        if row.phase not in PHASES:
            raise PartitionError(f"node '{row.name}' has phase {row.phase!r}, expected one of {PHASES}")
        for tid in list(row.inputs) + list(row.outputs):
            if tid not in producer_of:
                raise PartitionError(f"node '{row.name}' refers to unknown tensor '{tid}' (dangling edge)")
            if not fixed_tensor[tid] and producer_of[tid] not in index:
                raise PartitionError(f"node '{row.name}' reads tensor '{tid}' of unknown node "
                                     f"'{producer_of[tid]}' (dangling edge)")
    inputs = [list(x) for x in nodes["inputs"]]
    preds = [{index[producer_of[t]] for t in ins if not fixed_tensor[t]} for ins in inputs]
    forward_tbl = (nodes["phase"] == "forward").to_numpy()
    for v in range(len(names)):
        bad = [names[u] for u in sorted(preds[v]) if forward_tbl[v] and not forward_tbl[u]]
        if bad:
            raise PartitionError(f"forward node '{names[v]}' reads the backward result of '{bad[0]}'")
    order = _topological_order(names, preds)
    fwd_order = [v for v in order if forward_tbl[v]]
    if not fwd_order:
        raise PartitionError("graph has no forward ops to partition")
    key = _keys(order, fwd_order, preds, forward_tbl)
    return _assemble(nodes, tensors, names, order, preds, key, forward_tbl, len(fwd_order))


def _keys(order: list[int], fwd_order: list[int], preds: list[set[int]], forward: np.ndarray) -> np.ndarray:
    """Forward position of every op (table indexing), by rules 1-4 of the module docstring."""
    key = np.full(len(forward), -1, dtype=np.int64)
    key[fwd_order] = np.arange(len(fwd_order))
    succs: list[list[int]] = [[] for _ in forward]
    for v, ps in enumerate(preds):
        for u in ps:
            succs[u].append(v)
    holders: list[list[int]] = [[int(key[u])] for u in range(len(forward))]  # forward: producer + readers
    for v in fwd_order:
        for u in preds[v]:
            holders[u].append(int(key[v]))
    for v in order:
        if forward[v]:
            continue
        backward = [u for u in preds[v] if not forward[u]]
        grads = [int(key[u]) for u in backward if key[u] >= 0]
        source = min(grads, default=len(fwd_order)) if backward else None  # unplaced sources: the loss end
        acts = [_holder_below(holders[u], source) for u in preds[v] if forward[u]]
        if acts:
            key[v] = max(acts)
        elif grads:
            key[v] = min(grads)
    last = len(fwd_order) - 1
    for v in reversed(order):
        if key[v] < 0:
            consumers = [key[w] for w in succs[v] if key[w] >= 0]
            key[v] = max(consumers) if consumers else last
    return key


def _holder_below(holders: list[int], source: int | None) -> int:
    """Largest holder position below the gradient source; the producer's (first) without one."""
    below = [h for h in holders if source is not None and h < source]
    return max(below) if below else holders[0]


def _assemble(nodes: pd.DataFrame, tensors: pd.DataFrame, names: list[str], order: list[int],
              preds: list[set[int]], key: np.ndarray, forward: np.ndarray,
              n_forward: int) -> PipelineGraph:
    """Storage tables and neighbour ranges, everything re-indexed to topological order."""
    index = {name: i for i, name in enumerate(names)}
    storage_of = dict(zip(tensors.tensor_id, tensors.storage))
    is_fixed = tensors.kind.isin(FIXED_KINDS).to_numpy()
    fixed_ids = sorted(set(tensors.storage[is_fixed]))
    fixed_pos = {s: i for i, s in enumerate(fixed_ids)}
    size = dict(zip(tensors.storage, tensors.storage_bytes))
    movable: dict[int, int] = {}  # storage -> allocating node (first tensor row, as stage_problem does)
    for t in tensors.loc[~is_fixed].itertuples():
        movable.setdefault(t.storage, index[t.node])
    store_ids = list(movable)
    store_pos = {s: i for i, s in enumerate(store_ids)}
    reads: set[tuple[int, int]] = set()
    stash: set[tuple[int, int]] = set()
    fixed_reads: set[tuple[int, int]] = set()
    for v, ins in enumerate(nodes["inputs"]):
        for tid in ins:
            sid = storage_of[tid]
            if sid in fixed_pos:
                fixed_reads.add((fixed_pos[sid], int(key[v])))
                continue
            reads.add((store_pos[sid], int(key[v])))
            if not forward[v] and forward[movable[sid]]:
                stash.add((store_pos[sid], int(key[v])))
    cut_ok = np.ones(n_forward + 1, dtype=bool)
    for v, (ins, outs) in enumerate(zip(nodes["inputs"], nodes["outputs"])):
        if not forward[v]:
            continue
        made = {storage_of[t] for t in outs}
        if made and made <= {storage_of[t] for t in ins if storage_of[t] not in fixed_pos}:
            cut_ok[key[v]] = False
    cut_ok[0] = cut_ok[n_forward] = True
    lo = np.arange(n_forward)
    hi = np.arange(n_forward)
    for v, ps in enumerate(preds):
        for u in ps:
            a, b = key[u], key[v]
            lo[a], hi[a] = min(lo[a], b), max(hi[a], b)
            lo[b], hi[b] = min(lo[b], a), max(hi[b], a)
    time = nodes["time_s"].to_numpy(dtype=float)
    return PipelineGraph(
        names=tuple(names[v] for v in order),
        forward=forward[order],
        key=key[order],
        time=time[order],
        n_forward=n_forward,
        storage_bytes=np.array([size[s] for s in store_ids], dtype=np.int64),
        producer_key=np.array([key[movable[s]] for s in store_ids], dtype=np.int64),
        activation=np.array([bool(forward[movable[s]]) for s in store_ids], dtype=bool),
        fixed_bytes=np.array([size[s] for s in fixed_ids], dtype=np.int64),
        reads=_reads(reads),
        stash_reads=_reads(stash),
        fixed_reads=_reads(fixed_reads),
        neighbour_lo=lo,
        neighbour_hi=hi,
        cut_ok=cut_ok,
    )
