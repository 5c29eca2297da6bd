"""``trainplan fuse`` on bad input: one error line naming the node or op, exit 2, no output file."""

from __future__ import annotations

import json

import pytest

from trainplan.cli import main

TABLE = """
name: toy
ops: [aten.mm.default, aten.add.Tensor, aten.relu.default]
rules:
  - {ops: [aten.mm.default], max_dim: 64, why: matmul dims <= 64}
  - {ops: ["*"], deny_dtypes: [int64]}
"""


def _run(tmp_path, graph: dict, table: str | None = None) -> tuple[int, str]:
    (tmp_path / "g.json").write_text(json.dumps(graph))
    args = ["fuse", str(tmp_path / "g.json"), "-o", str(tmp_path / "out.json")]
    if table is not None:
        (tmp_path / "t.yaml").write_text(table)
        args += ["--support", str(tmp_path / "t.yaml")]
    return main(args), str(tmp_path / "out.json")


def _t(shape, dtype="float32"):
    return {"shape": shape, "dtype": dtype}


@pytest.mark.parametrize("graph, table, message", [
    ({"nodes": [{"id": "a", "op": "x", "supported": True}, {"id": "b", "op": "x", "supported": True}],
      "edges": [["a", "b"], ["b", "a"]]}, None, "cycle through node '(a|b)'"),
    ({"nodes": [{"id": k, "op": "x", "supported": True} for k in "abcd"],  # d lies after the cycle b -> c -> b
      "edges": [["a", "b"], ["b", "c"], ["c", "b"], ["c", "d"]]}, None, "cycle through node '(b|c)'"),
    ({"nodes": [{"id": "a", "op": "x", "supported": True}], "edges": [["a", "zz"]]}, None, "node 'zz'.*dangling"),
    ({"nodes": [{"id": "a", "op": "x"}], "edges": []}, None, "node 'a' has no 'supported'"),
    ({"nodes": [{"id": "a", "op": "aten.mm.default"}], "edges": []},
     TABLE.replace("[aten.mm.default], max_dim", "[aten.conv2d.default], max_dim"), "unknown op 'aten.conv2d.default'"),
    ({"nodes": [{"id": "a", "op": "aten.mm.default"}], "edges": []},
     TABLE.replace("aten.relu.default", "aten.relu_typo.default"), "unknown op 'aten.relu_typo.default'"),
])
def test_bad_input_names_the_culprit_and_writes_nothing(tmp_path, capsys, graph, table, message) -> None:
    rc, out = _run(tmp_path, graph, table)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("trainplan fuse: error:") and err.count("\n") == 1
    assert pytest.importorskip("re").search(message, err), err
    assert not (tmp_path / "out.json").exists()


def test_table_and_rules_decide_the_groups(tmp_path) -> None:
    nodes = [
        {"id": "a", "op": "aten.mm.default", "inputs": [_t([8, 8]), _t([8, 8])], "outputs": [_t([8, 8])]},
        {"id": "b", "op": "aten.relu.default", "inputs": [_t([8, 8])], "outputs": [_t([8, 8])]},
        {"id": "c", "op": "aten.mm.default", "inputs": [_t([8, 128]), _t([128, 8])], "outputs": [_t([8, 8])]},
        {"id": "d", "op": "aten.add.Tensor", "inputs": [_t([8, 8])], "outputs": [_t([8, 8])]},
        {"id": "e", "op": "aten.add.Tensor", "inputs": [_t([8], "int64")], "outputs": [_t([8], "int64")]},
        {"id": "f", "op": "aten.embedding.default"},
        {"id": "g", "op": "aten.relu.default", "supported": False},
    ]
    edges = [["a", "b"], ["b", "c"], ["c", "d"], ["d", "e"], ["e", "f"], ["f", "g"]]
    rc, out = _run(tmp_path, {"nodes": nodes, "edges": edges}, TABLE)
    assert rc == 0
    doc = json.loads(open(out).read())
    assert [g["nodes"] for g in doc["groups"]] == [["a", "b"], ["d"]]
    assert doc["host_nodes"] == ["c", "e", "f", "g"]
    assert "max_dim 64" in doc["rejected"]["c"] and "int64" in doc["rejected"]["e"]
