"""Artifact files: written atomically with the mode the umask allows (not mkstemp's 0600); read with one-line
errors naming the file."""

from __future__ import annotations

import os
import stat

import pandas as pd
import pytest

from trainplan.errors import ArtifactError
from trainplan.io import read_json, read_text, read_yaml, write_json, write_table, write_yaml


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


def test_a_binary_malformed_or_unreadable_file_is_named_on_one_line(tmp_path):
    binary = tmp_path / "b.json"
    binary.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ArtifactError, match=rf"^artifact {binary}: not UTF-8 text \(byte 7 is 0xff\)"):
        read_json(binary)
    bad = tmp_path / "c.yaml"
    bad.write_text("a: [1, 2\nb: 3\n")
    with pytest.raises(ArtifactError) as raised:
        read_yaml(bad, "config file")
    assert str(raised.value) == (f"config file {bad}: invalid YAML at line 2, column 2: expected ',' or ']', "
                                 "but got ':' (while parsing a flow sequence)")
    with pytest.raises(ArtifactError, match=rf"^artifact {tmp_path}: cannot be read: Is a directory"):
        read_text(tmp_path)
