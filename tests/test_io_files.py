"""Artifact files: written atomically with the mode the umask allows (not mkstemp's 0600)."""

from __future__ import annotations

import os
import stat

import pandas as pd
import pytest

from trainplan.io import write_json, write_table, write_yaml


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_respect_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        write_json(tmp_path / "a.json", {"x": 1})
        write_yaml(tmp_path / "a.yaml", {"x": 1})
        write_table(tmp_path / "a.parquet", pd.DataFrame({"x": [1]}))
        write_table(tmp_path / "a.csv", pd.DataFrame({"x": [1]}))
    finally:
        os.umask(old)
    for name in ("a.json", "a.yaml", "a.parquet", "a.csv"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "a.json", "a.parquet", "a.yaml"]  # no temp left
