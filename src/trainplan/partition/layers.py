"""A model's layers along the forward positions of its pipeline graph, read from the ops' module paths: the
partitions that split at layer boundaries (:mod:`~trainplan.partition.methods`) cut only where a layer starts.

Blocks are the children of the model's block list: the module list (a path component that is an index, as in
``transformer.h.3`` or ``model.layers.0``) whose children run the most forward ops. A block all of whose ops run in
one list inside it (HF ResNet's ``encoder.stages.1`` runs only ``encoder.stages.1.layers.<j>``) is replaced by that
list's children, recursively, so that ResNet's blocks are its bottlenecks. The ops before the first block form the
layer ``pre`` (embeddings, a CNN's stem), those after the last one ``post`` (final norm, head, loss); an op outside
the blocks between two of them joins the block before it. A layer starting with views of the layer before's output
(``graph.cut_ok``) starts after them, so a split at layer boundaries never separates an op from its views.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainplan.partition.errors import PartitionError
from trainplan.partition.graph import PipelineGraph

PRE, POST = "pre", "post"
_INDEX = re.compile(r"^((?:.*?\.)?\d+)(?:\.|$)")  # a module path up to its outermost index component


@dataclass(frozen=True)
class Layers:
    """The layers in forward order: each one's name, first forward position and parameter count (the numel of the
    parameters its forward ops read; a tied weight counts in each layer reading it, as DeepSpeed's tied layers)."""

    names: tuple[str, ...]
    starts: tuple[int, ...]
    parameters: tuple[int, ...]
    n_forward: int

    @property
    def blocks(self) -> list[int]:
        """Indices of the blocks (every layer but ``pre`` and ``post``)."""
        return [i for i, name in enumerate(self.names) if name not in (PRE, POST)]

    def cuts(self, layer_cuts: list[int] | tuple[int, ...]) -> tuple[int, ...]:
        """Forward-position cuts of a split into stages at these layer indices (0 = c_0 < ... < c_k = layers)."""
        return tuple(self.n_forward if c == len(self.names) else self.starts[c] for c in layer_cuts)


def _block(path: str) -> str | None:
    match = _INDEX.match(path)
    return match[1] if match else None


def _refine(paths: list[str], block: str) -> list[str] | None:
    """The blocks inside ``block`` when all its ops' paths run in one indexed list under it, else None."""
    inner = [_block(p[len(block) + 1:]) if p.startswith(block + ".") else None for p in paths]
    if not inner or None in inner:
        return None
    lists = {name.rpartition(".")[0] for name in inner if name}
    return [f"{block}.{name}" for name in inner if name] if len(lists) == 1 else None


def _blocks(paths: list[str]) -> list[str | None]:
    """Each forward op's block (None outside every block)."""
    found = [_block(p) for p in paths]
    lists = Counter(b.rpartition(".")[0] for b in found if b)
    if not lists:
        return [None] * len(paths)
    chosen = max(lists, key=lambda name: (len({b for b in found if b and b.rpartition(".")[0] == name}), lists[name]))
    out = [b if b and b.rpartition(".")[0] == chosen else None for b in found]
    while True:
        changed = False
        for block in dict.fromkeys(b for b in out if b):
            members = [i for i, b in enumerate(out) if b == block]
            inner = _refine([paths[i] for i in members], block)
            if inner is not None:
                for i, name in zip(members, inner):
                    out[i] = name
                changed = True
        if not changed:
            return out


def model_layers(graph: PipelineGraph, nodes: pd.DataFrame, tensors: pd.DataFrame, model: str) -> Layers:
    """The layers of ``graph`` (its forward ops' ``module`` paths in ``nodes``; parameter sizes from ``tensors``).
    Raises PartitionError naming the model when no op runs in a block list."""
    forward = [graph.names[i] for i in np.flatnonzero(graph.forward)]
    module = dict(zip(nodes.name, nodes.module.fillna("")))
    blocks = _blocks([module.get(name, "") for name in forward])
    if not any(blocks):
        raise PartitionError(f"model '{model}': no forward op runs in a module list (such as transformer.h.<i>): "
                             "no blocks to split at")
    params = tensors.loc[tensors.kind == "parameter"].drop_duplicates("tensor_id")
    numel = dict(zip(params.tensor_id, params.numel))
    reads = dict(zip(nodes.name, nodes.inputs))
    inside = [pos for pos, block in enumerate(blocks) if block]
    names: list[str] = []
    starts: list[int] = []
    read: list[set[str]] = []
    for pos, (name, block) in enumerate(zip(forward, blocks)):
        if block:
            layer = block
        elif pos < inside[0] or pos > inside[-1]:
            layer = PRE if pos < inside[0] else POST
        else:
            layer = names[-1]  # outside the blocks between two of them: joins the one before
        if layer not in names:
            names.append(layer)
            starts.append(pos)
            read.append(set())
        read[names.index(layer)].update(t for t in reads.get(name, ()) if t in numel)
    allowed = np.flatnonzero(graph.cut_ok)
    starts = [int(allowed[np.searchsorted(allowed, pos)]) for pos in starts]  # past views of the layer before
    empty = [name for name, a, b in zip(names, starts, [*starts[1:], len(forward)]) if a >= b]
    if empty:
        raise PartitionError(f"model '{model}': layer '{empty[0]}' holds only views of the layer before it: no "
                             "split can start there")
    return Layers(tuple(names), tuple(starts), tuple(int(sum(numel[t] for t in r)) for r in read), len(forward))
