"""Per-op mixed precision and the seed-000 overflow loop (S1 detect, S2 root cause, S3 deny-list).

Typical use::

    traced, flat, _ = build_case("gpt2", spec, seed=0)
    result = fix_overflow(traced, flat, default_policy(), parse_injections(entries, traced.gm))
    result.final_policy.to_dict()   # allow / deny / infer lists with the denied roots

The names below are imported on first use: importing a submodule (the workflow reads ``paths`` and ``policy``
when it starts) does not import torch.
"""

from typing import Any

__all__ = [
    "Assignment", "Finding", "FixResult", "Injection", "InjectionError", "IterationResult", "OverflowDetector",
    "ParamScale", "Policy", "PolicyError", "PrecisionInterpreter", "ValueCheck", "analyse", "assign_precision",
    "autocast_policy", "build_case", "check_value", "default_policy", "fix_overflow", "fp32_dtypes",
    "inherent_bad_nodes", "load_policy", "parse_injections", "policy_from_dict", "run_iteration", "run_step",
    "scale_parameters", "sentinel_nodes",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'trainplan.precision' has no attribute {name!r}")
    from trainplan.precision.assign import Assignment, assign_precision, fp32_dtypes, sentinel_nodes
    from trainplan.precision.cases import ParamScale, build_case, scale_parameters
    from trainplan.precision.detect import Finding, OverflowDetector, ValueCheck, analyse, check_value
    from trainplan.precision.interpreter import Injection, InjectionError, PrecisionInterpreter, parse_injections, run_step
    from trainplan.precision.iterate import FixResult, IterationResult, fix_overflow, inherent_bad_nodes, run_iteration
    from trainplan.precision.lists import autocast_policy, default_policy
    from trainplan.precision.policy import Policy, PolicyError, load_policy, policy_from_dict

    return locals()[name]
