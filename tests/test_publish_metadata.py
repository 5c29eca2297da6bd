"""publish renames, in Snakemake's metadata, inputs found in the repository to their path in the archive."""

from __future__ import annotations

import json

from trainplan.provenance.archive import relocated_metadata


def test_repository_inputs_become_archive_paths(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    table = f"{repo.resolve()}/config/targets/acclib.yaml"
    record = {"rule": "fuse", "input": ["results/export/m/cpu/nodes.parquet", table, "/elsewhere/x.yaml"],
              "input_checksums": {table: "sha256:ab"}, "params": ["acclib"]}
    out = json.loads(relocated_metadata(record, repo))
    assert out["input"] == ["results/export/m/cpu/nodes.parquet", "config/targets/acclib.yaml", "/elsewhere/x.yaml"]
    assert out["input_checksums"] == {"config/targets/acclib.yaml": "sha256:ab"}
    assert out["rule"] == "fuse" and out["params"] == ["acclib"]
