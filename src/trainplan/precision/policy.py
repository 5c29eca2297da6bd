"""Mixed-precision policies: allow / deny / infer lists keyed by aten op, with per-node overrides.

An op key is an aten overload packet (``aten.mm``) or a full overload (``aten.mm.default``); the full
overload wins over the packet. Node overrides (fx node names, e.g. ``mm_17``) win over op keys: S3 adds
roots to ``deny_nodes``, so only the op instance that overflowed leaves fp16, not every op of its type.
An op on no list is ``infer``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainplan.errors import ArtifactError
from trainplan.io import read_yaml
from trainplan.schemas import SchemaError, check

if TYPE_CHECKING:
    import torch

ALLOW, DENY, INFER = "allow", "deny", "infer"
INFER_MODES = ("producer", "promote")


class PolicyError(ValueError):
    """A precision policy file or mapping is malformed; the message names the key."""


@dataclass(frozen=True)
class Policy:
    """Allow (fp16), deny (fp32) and infer (follow producers) lists.

    ``infer_mode``: ``producer`` (the seed's grey list: an infer op runs in fp16 iff every op that
    produced one of its floating inputs runs in fp16; parameters and constants are cast on use and do
    not vote) or ``promote`` (PyTorch autocast's type promotion: fp32 parameters vote too).
    """

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    infer: tuple[str, ...] = ()
    allow_nodes: tuple[str, ...] = ()
    deny_nodes: tuple[str, ...] = ()
    deny_forward_only: bool = False
    infer_mode: str = "producer"
    name: str = "custom"

    def __post_init__(self) -> None:
        if self.infer_mode not in INFER_MODES:
            raise PolicyError(f"policy '{self.name}': infer_mode must be one of {INFER_MODES}, got '{self.infer_mode}'")
        both = set(self.allow) & set(self.deny) | set(self.allow_nodes) & set(self.deny_nodes)
        if both:
            raise PolicyError(f"policy '{self.name}': {sorted(both)} on both the allow and the deny list")

    def with_denied_nodes(self, nodes: list[str], name: str | None = None) -> Policy:
        """This policy with ``nodes`` added to ``deny_nodes`` (and dropped from ``allow_nodes``)."""
        deny = tuple(dict.fromkeys([*self.deny_nodes, *nodes]))
        allow = tuple(n for n in self.allow_nodes if n not in deny)
        return replace(self, deny_nodes=deny, allow_nodes=allow, name=name or self.name)

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping for YAML artifacts (lists, not tuples). ``counts`` (each list's length) comes before
        the lists, so a file cut anywhere after it is detected on load."""
        lists = {key: list(getattr(self, key)) for key in _LISTS}
        return {
            "name": self.name,
            "counts": {key: len(value) for key, value in lists.items()},
            "infer_mode": self.infer_mode,
            "deny_forward_only": self.deny_forward_only,
            **lists,
        }


_LISTS = ("allow", "deny", "infer", "allow_nodes", "deny_nodes")
_KEYS = {"name", "infer_mode", "deny_forward_only", "counts", *_LISTS}


def policy_from_dict(data: dict[str, Any], source: str = "policy") -> Policy:
    """Build a Policy from a mapping (as in a YAML file); unknown keys are an error naming the key."""
    if not isinstance(data, dict):
        raise PolicyError(f"{source}: expected a mapping, got {type(data).__name__}")
    unknown = set(data) - _KEYS
    if unknown:
        raise PolicyError(f"{source}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    lists = {}
    for key in _LISTS:
        value = data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise PolicyError(f"{source}: key '{key}' must be a list of strings")
        lists[key] = tuple(value)
    return Policy(
        **lists,
        deny_forward_only=bool(data.get("deny_forward_only", False)),
        infer_mode=str(data.get("infer_mode", "producer")),
        name=str(data.get("name", Path(source).stem)),
    )


def load_policy(path: str | Path, written: bool = False) -> Policy:
    """Read a policy YAML file, checked against the ``policy`` schema and its ``counts`` when present;
    ``written``: a file the workflow wrote, which must have every list's count."""
    try:
        data = read_yaml(path, "policy file")
        check(data, "policy", str(path))
        if written and set(data.get("counts", {})) != set(_LISTS):
            raise SchemaError(f"{path}: 'counts' lacks {sorted(set(_LISTS) - set(data.get('counts', {})))}: truncated?")
    except ArtifactError as exc:  # missing, not text, not YAML, or not a policy (SchemaError)
        raise PolicyError(str(exc)) from exc
    return policy_from_dict(data, str(path))


def load_next_policy(path: str | Path, findings: dict[str, Any], findings_path: str | Path) -> Policy:
    """The policy a pass handed on (``policy_next.yaml``), checked against the deny list its findings state."""
    policy = load_policy(path, written=True)
    if list(policy.deny_nodes) != findings["deny_nodes"]:
        raise PolicyError(f"{path}: deny_nodes {list(policy.deny_nodes)[:5]} differ from the {len(findings['deny_nodes'])} "
                          f"'deny_nodes' of {findings_path}: edited or truncated; delete both to rerun the pass")
    return policy


def op_keys(node: torch.fx.Node) -> tuple[str, str]:
    """(full overload, packet) keys of an op node, e.g. ('aten.mm.default', 'aten.mm')."""
    if node.target is operator.getitem:
        return ("getitem", "getitem")
    packet = getattr(node.target, "overloadpacket", None)
    return (str(node.target), str(packet) if packet is not None else str(node.target))


def list_of(node: torch.fx.Node, policy: Policy, phase: str) -> str:
    """Which list (allow / deny / infer) governs ``node`` under ``policy``."""
    if node.name in policy.deny_nodes:
        return DENY
    if node.name in policy.allow_nodes:
        return ALLOW
    for key in op_keys(node):
        if key in policy.deny and not (policy.deny_forward_only and phase == "backward"):
            return DENY
        if key in policy.allow:
            return ALLOW
        if key in policy.infer:
            return INFER
    return INFER
