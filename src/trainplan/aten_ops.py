"""Facts read off aten op names, without importing torch (the partition, schedule and balance rules do not
load it)."""

from __future__ import annotations

#: aten ops whose result depends on random state: recomputing them would not reproduce the value
RANDOM_OPS = ("aten.rand", "aten.randn", "aten.bernoulli", "aten.native_dropout", "aten.randperm", "aten.randint")


def is_inplace(op: str) -> bool:
    """True for an aten op that mutates an input (``aten.add_.Tensor``, ``aten.copy_.default``)."""
    parts = op.split(".")
    return len(parts) >= 2 and parts[1].endswith("_") and not parts[1].startswith("_")


#: ``trainplan::embedding_grad_add`` written into its first argument, and its functional form (a pipeline's: a stage
#: never writes into a storage another stage makes; ``export.functional_sums``)
IN_PLACE_SUM = "trainplan.embedding_grad_add_.default"
FUNCTIONAL_SUM = "trainplan.embedding_grad_add.default"

#: ops that make a weight's gradient as the sum of its uses' gradients as a pipeline sees them (autograd's add of a
#: tied weight's two gradients; ``trainplan::embedding_grad_add``, the pass ``export.embedding_grads`` puts in its
#: place for an embedding) -> how many of their leading inputs are whole terms of the sum (the rest: the
#: embedding's rows)
GRADIENT_SUMS = {"aten.add.Tensor": 2, FUNCTIONAL_SUM: 1}
#: the sum whose result is its other term when one term reads zeros (a tied partial reduced once per step)
PLAIN_SUM = "aten.add.Tensor"
