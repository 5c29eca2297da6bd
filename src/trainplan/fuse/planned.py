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
from trainplan.fuse.support import SupportTable, builtin_table, table_from_dict, without

if TYPE_CHECKING:
    import torch

    from trainplan.fuse.fused_ops import FusedModel
    from trainplan.models import BuiltModel

#: the ``callable`` of a fused model's spec
CALLABLE = "trainplan.fuse.planned:fused_model"
#: how a fused op runs: Inductor's code for each half, or the halves' fx graphs
COMPILERS = ("inductor", "fx")


def fused_spec(model: str, spec: dict[str, Any], target: dict[str, Any], *, seed: int, min_ops: int = 2,
               max_ops: int | None = None, compiler: str = "inductor") -> dict[str, Any]:
    """The model spec of ``model`` (config entry ``spec``) with its forward groups for ``target`` fused:
    ``target`` is a built-in (``{builtin: inductor}``, ``{builtin: inductor-no-matmul}``) or a support table's
    document (its YAML's content, so that a change to the table changes the spec); groups of more than ``max_ops``
    ops split at their cuts (``trainplan.fuse.split``)."""
    return {"source": "callable", "callable": CALLABLE,
            "kwargs": {"model": model, "spec": spec, "target": target, "seed": seed, "min_ops": min_ops,
                       "max_ops": max_ops, "compiler": compiler}}


def target_table(model: str, target: dict[str, Any]) -> SupportTable:
    """The support table of a fused spec's ``target``; FuseError names the model."""
    table = builtin_table(str(target.get("builtin")))
    if table is not None:
        return table
    if "ops" in target:
        return table_from_dict(target, f"of fused model '{model}'")
    raise FuseError(f"fused model '{model}': target must be {{builtin: inductor}}, {{builtin: inductor-no-matmul}} or "
                    f"a support table, got {target!r}")


#: forward ops no fused op takes: an embedding's backward stays an op of the traced step, where a tied weight's
#: two gradients are summed row by row (``trainplan.export.embedding_grads``); inside a fused op its gradient would
#: be a dense table added outside (GPT-2 small: a third 147 MiB tensor at the end of the backward)
UNFUSED_OPS = ("embedding",)


def fuse_built(built: BuiltModel, table: SupportTable, *, min_ops: int = 2, max_ops: int | None = None,
               compile_with_inductor: bool = True) -> FusedModel:
    """``built`` with the groups of its forward graph for ``table`` less UNFUSED_OPS (``forward_groups``, those of
    more than ``max_ops`` ops split) of >= ``min_ops`` ops as fused ops."""
    from trainplan.fuse.forward import forward_groups, trace_forward
    from trainplan.fuse.fused_ops import fuse_model

    _, _, groups = forward_groups(trace_forward(built), without(table, UNFUSED_OPS, "no-embedding"), max_ops)
    return fuse_model(built, groups, min_ops=min_ops, compile_with_inductor=compile_with_inductor)


def fused_model(model: str, spec: dict[str, Any], target: dict[str, Any], seed: int = 0, min_ops: int = 2,
                max_ops: int | None = None, compiler: str = "inductor"
                ) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The callable of :func:`fused_spec`: model ``model`` built from ``spec`` with ``seed`` (its weights and batch
    as the raw model's), its forward groups fused; the module (``fusion``: which groups run fused and how) and
    the batch."""
    from trainplan.models import build_model

    if compiler not in COMPILERS:
        raise FuseError(f"fused model '{model}': compiler must be one of {list(COMPILERS)}, got '{compiler}'")
    built = build_model(model, spec, seed=seed)
    fused = fuse_built(built, target_table(model, target), min_ops=min_ops, max_ops=max_ops,
                       compile_with_inductor=compiler == "inductor")
    return fused.built.module, built.batch


#: where the float32 check fails, the same groups fused in float64 must give the float64 eager step's gradients this
#: close (each parameter's largest error over its largest exact entry): float64 round-off is ~1e-12 (ResNet-50's
#: Inductor groups: 1.3e-12), a kernel that computes something else is far above it
FLOAT64_RTOL = 1e-9


def gradients_vs_unfused(fused: BuiltModel, spec: dict[str, Any], *, rtol: float, atol: float) -> dict[str, Any]:
    """A fused model's loss and gradients (``fused``, built from the :func:`fused_spec` ``spec``) against the unfused
    model's: both steps checked against the model's step in float64 (:func:`trainplan.fuse.train_step.
    check_against_exact`: each parameter's error at most ``rtol`` or 3x eager's own relative error there, above a
    floor of ``atol``), on the unfused model's weights and batch: the ``fused`` and ``eager`` results. Where the
    fused step is outside that, the spec's groups are fused again in float64 and checked against the float64 eager
    step (``float64``, :func:`float64_check`): ill-conditioned gradients (batch norm at batch 2) amplify float32
    round-off, which kernels summing in another order change. ``passed``: within tolerance, or exact in float64."""
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

    results: dict[str, Any] = check_against_exact(raw, fg, {"eager": fg.gm, "fused": fused_step}, rtol, atol)
    results.update(rtol=rtol, atol=atol, passed=results["fused"]["within_tolerance"])
    if not results["passed"]:
        results["float64"] = float64_check(spec)
        results["passed"] = results["float64"]["within_tolerance"]
    return results


def float64_check(spec: dict[str, Any]) -> dict[str, Any]:
    """The model of a :func:`fused_spec` ``spec`` in float64, its forward groups fused as the spec says, against its
    eager float64 step: each parameter's largest gradient error over its largest exact entry (the model's largest
    where its gradient is zero), the worst, and whether it is at most FLOAT64_RTOL. The groups are found on the
    float64 graph: those of the float32 one for a support table without dtype conditions."""
    import copy

    import torch

    from trainplan.models import BuiltModel, build_model

    kwargs = spec["kwargs"]
    raw = build_model(kwargs["model"], kwargs["spec"], seed=kwargs["seed"])
    exact = copy.deepcopy(raw.module).double()
    batch = {k: v.double() if v.is_floating_point() else v for k, v in raw.batch.items()}
    model = BuiltModel(raw.name, raw.module.double(), batch, raw.loss_fn)
    fused = fuse_built(model, target_table(kwargs["model"], kwargs["target"]), min_ops=kwargs["min_ops"],
                       max_ops=kwargs.get("max_ops"), compile_with_inductor=kwargs["compiler"] == "inductor")
    fused.built.module(**batch).backward()
    raw.loss_fn(exact(**batch)).backward()
    pairs = [(name, p.grad if p.grad is not None else torch.zeros_like(p), e.grad if e.grad is not None else
              torch.zeros_like(e)) for (name, p), e in zip(model.module.named_parameters(), exact.parameters())]
    largest = max(float(e.abs().max()) for _, _, e in pairs)
    errors = {name: float((g - e).abs().max()) / (float(e.abs().max()) or largest or 1.0) for name, g, e in pairs}
    worst = max(errors, key=errors.__getitem__)
    return {"max_rel_err": errors[worst], "worst_at": worst, "rtol": FLOAT64_RTOL,
            "within_tolerance": errors[worst] <= FLOAT64_RTOL}
