"""Artifact schemas (trainplan/schemas): real artifacts pass; truncated or edited ones fail naming the file."""

from __future__ import annotations

import json

import pytest
import yaml

from trainplan.errors import ArtifactError
from trainplan.io import read_json, write_json, write_yaml
from trainplan.precision.lists import default_policy
from trainplan.precision.policy import PolicyError, load_next_policy, load_policy
from trainplan.schedule import solve
from trainplan.schedule.synthetic import training_graph
from trainplan.schemas import SchemaError, check, names


def test_every_schema_is_valid_and_documented():
    assert {"policy", "partition", "problem", "schedule", "plan", "findings", "iterations", "provenance", "validation"} <= set(names())
    for name in names():
        with pytest.raises(SchemaError, match=f"nowhere.json: not a valid {name} artifact"):
            check([], name, "nowhere.json")


def test_policy_counts_catch_a_truncated_list(tmp_path):
    policy = default_policy().with_denied_nodes(["mm_1", "addmm_2", "mm_3"], name="default+iter1")
    path = tmp_path / "policy_next.yaml"
    write_yaml(path, policy.to_dict())
    assert load_policy(path) == policy
    data = yaml.safe_load(path.read_text())
    data["deny_nodes"] = data["deny_nodes"][:1]  # cut mid-list: still valid YAML
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(PolicyError, match=r"policy_next.yaml: .*'deny_nodes' has 1 entries, 'counts.deny_nodes' says 3"):
        load_policy(path)
    data["deny_nodes"] = ["mm_1", "mm_1", "mm_3"]  # a node listed twice
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(PolicyError, match=r"policy_next.yaml: not a valid policy artifact: at deny_nodes: .*non-unique"):
        load_policy(path)


def test_next_policy_must_carry_the_findings_deny_list(tmp_path):
    policy = default_policy().with_denied_nodes(["mm_1"])
    path = tmp_path / "policy_next.yaml"
    write_yaml(path, policy.to_dict())
    assert load_next_policy(path, {"deny_nodes": ["mm_1"]}, "findings.json") == policy
    with pytest.raises(PolicyError, match=r"policy_next.yaml: deny_nodes .* differ from .* findings.json"):
        load_next_policy(path, {"deny_nodes": ["mm_1", "mm_2"]}, "findings.json")


def test_schedule_counts_catch_dropped_events(tmp_path):
    problem = training_graph(12, seed=1)
    budget = int(0.5 * solve(problem, 2, 1, 0, method="no_recompute").peak_bytes)
    sched = solve(problem.with_budget(budget), 2, 1, 0)
    raw = sched.to_dict()
    assert sched.ok and raw["recomputes"] + raw["swap_ins"] > 0, raw
    path = tmp_path / "stage0.json"
    write_json(path, raw)
    assert read_json(path, schema="schedule")["events"] == raw["events"]
    kind = "swap_in" if raw["swap_ins"] else "compute"
    last = max(i for i, (k, _) in enumerate(raw["events"]) if k == kind)
    write_json(path, {**raw, "events": raw["events"][:last]})
    with pytest.raises(ArtifactError, match=r"stage0.json: inconsistent schedule artifact .*'events' hold"):
        read_json(path, schema="schedule")
    write_json(path, {**raw, "status": "great"})
    with pytest.raises(ArtifactError, match=r"stage0.json: not a valid schedule artifact: at status"):
        read_json(path, schema="schedule")


def test_problem_schema_names_the_key(tmp_path):
    problem = training_graph(6, seed=0).to_dict()
    path = tmp_path / "stage0.json"
    path.write_text(json.dumps({**problem, "ops": [{k: v for k, v in op.items() if k != "bytes"} for op in problem["ops"]]}))
    with pytest.raises(ArtifactError, match=r"stage0.json: not a valid problem artifact: at ops\[0\]: 'bytes' is a required"):
        read_json(path, schema="problem")


def test_a_policy_cut_anywhere_is_detected(tmp_path):
    policy = default_policy().with_denied_nodes(["mm_1", "addmm_2"], name="default+iter1")
    path = tmp_path / "policy_next.yaml"
    write_yaml(path, policy.to_dict())
    lines = path.read_text().splitlines(keepends=True)
    findings = {"deny_nodes": ["mm_1", "addmm_2"]}
    for cut in range(1, len(lines)):
        path.write_text("".join(lines[:cut]))
        with pytest.raises(PolicyError, match="policy_next.yaml"):
            load_next_policy(path, findings, "findings.json")
