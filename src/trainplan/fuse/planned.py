"""Model ``<model>+<target>``: a configured model whose forward groups for one fusion target run as fused ops
(:mod:`trainplan.fuse.fused_ops`), the coarser graph that ``fuse.plan`` plans.

The workflow names it by the model spec :func:`fused_spec` returns, a ``callable`` spec of :func:`fused_model`, so
every rule that builds a model from its spec (export, profile, validate) builds this one through
``trainplan.models.build_model`` and its code version covers this package. The build is deterministic: the same
spec and seed give the same groups, the same fused op names and so the same traced step in every process.
The workflow imports this module when it starts: torch, the models and the tracing and compiling modules are
imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainplan.fuse.errors import FuseError
from trainplan.fuse.support import SupportTable, builtin_table, table_from_dict

if TYPE_CHECKING:
    import torch

    from trainplan.fuse.fused_ops import FusedModel
    from trainplan.models import BuiltModel

#: the ``callable`` of a fused model's spec
CALLABLE = "trainplan.fuse.planned:fused_model"
#: how a fused op runs: Inductor's code for each half, or the halves' fx graphs
COMPILERS = ("inductor", "fx")


def fused_spec(model: str, spec: dict[str, Any], target: dict[str, Any], *, seed: int, min_ops: int = 2,
               compiler: str = "inductor") -> dict[str, Any]:
    """The model spec of ``model`` (config entry ``spec``) with its forward groups for ``target`` fused:
    ``target`` is a built-in (``{builtin: inductor}``, ``{builtin: inductor-no-matmul}``) or a support table's document (its YAML's content, so that a change
    to the table changes the spec)."""
    return {"source": "callable", "callable": CALLABLE,
            "kwargs": {"model": model, "spec": spec, "target": target, "seed": seed, "min_ops": min_ops,
                       "compiler": compiler}}


def target_table(model: str, target: dict[str, Any]) -> SupportTable:
    """The support table of a fused spec's ``target``; FuseError names the model."""
    table = builtin_table(str(target.get("builtin")))
    if table is not None:
        return table
    if "ops" in target:
        return table_from_dict(target, f"of fused model '{model}'")
    raise FuseError(f"fused model '{model}': target must be {{builtin: inductor}}, {{builtin: inductor-no-matmul}} or "
                    f"a support table, got {target!r}")


def fuse_built(built: BuiltModel, table: SupportTable, *, min_ops: int = 2, compile_with_inductor: bool = True
               ) -> FusedModel:
    """``built`` with the groups of its forward graph for ``table`` (``forward_groups``) of >= ``min_ops`` ops as
    fused ops."""
    from trainplan.fuse.forward import forward_groups, trace_forward
    from trainplan.fuse.fused_ops import fuse_model

    _, _, groups = forward_groups(trace_forward(built), table)
    return fuse_model(built, groups, min_ops=min_ops, compile_with_inductor=compile_with_inductor)


def fused_model(model: str, spec: dict[str, Any], target: dict[str, Any], seed: int = 0, min_ops: int = 2,
                compiler: str = "inductor") -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The callable of :func:`fused_spec`: model ``model`` built from ``spec`` with ``seed`` (its weights and batch
    as the raw model's), its forward groups fused; the module (``fusion``: which groups run fused and how) and
    the batch."""
    from trainplan.models import build_model

    if compiler not in COMPILERS:
        raise FuseError(f"fused model '{model}': compiler must be one of {list(COMPILERS)}, got '{compiler}'")
    built = build_model(model, spec, seed=seed)
    fused = fuse_built(built, target_table(model, target), min_ops=min_ops,
                       compile_with_inductor=compiler == "inductor")
    return fused.built.module, built.batch


def gradients_vs_unfused(fused: BuiltModel, spec: dict[str, Any], *, rtol: float, atol: float) -> dict[str, Any]:
    """A fused model's loss and gradients (``fused``, built from the :func:`fused_spec` ``spec``) against the unfused
    model's: both steps checked against the model's step in float64 (:func:`trainplan.fuse.train_step.
    check_against_exact`: each parameter's error at most ``rtol`` or 3x eager's own relative error there, above a
    floor of ``atol``), on the unfused model's weights and batch. Returns the ``fused`` and ``eager`` results."""
    from torch.func import functional_call

    from trainplan.fuse.forward import trace_forward
    from trainplan.fuse.train_step import check_against_exact
    from trainplan.models import build_model

    kwargs = spec["kwargs"]
    raw = build_model(kwargs["model"], kwargs["spec"], seed=kwargs["seed"])
    fg = trace_forward(raw)
    params = {f"model.{name}": p for name, p in zip(fg.param_names, fg.params)}  # FusedModule holds the model

    def fused_step(*_inputs: Any) -> Any:
        return functional_call(fused.module, params, kwargs=raw.batch)

    results = check_against_exact(raw, fg, {"eager": fg.gm, "fused": fused_step}, rtol, atol)
    return {**results, "rtol": rtol, "atol": atol}
