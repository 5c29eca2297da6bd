"""The workflow's start-up checks that need torch, done once: a model entry or support table that passed is not
checked again until it, the checking code, a callable's module or the torch/transformers versions change."""

from __future__ import annotations

import sys

import pytest

from trainplan.errors import ModelSpecError
from trainplan.fuse.errors import FuseError
from trainplan.start_checks import CheckRecord, check_models, check_table, default_record
from trainplan.models import check_spec

GPT2 = {"architecture": "GPT2LMHeadModel", "config": {"n_layer": 1, "n_embd": 32, "n_head": 2}}


def test_a_passed_entry_is_checked_once_and_again_when_it_changes(tmp_path):
    path = tmp_path / "checked"
    assert check_models({"a": GPT2}, CheckRecord(path)) == ["a"]
    assert check_models({"a": GPT2}, CheckRecord(path)) == []  # a new process reads the record
    assert len(path.read_text().split()) == 1
    bigger = {**GPT2, "config": {**GPT2["config"], "n_layer": 2}}
    assert check_models({"a": bigger, "b": GPT2}, CheckRecord(path)) == ["a", "b"]  # a new entry or name: checked


def test_a_bad_entry_fails_every_time_and_is_not_recorded(tmp_path):
    record = CheckRecord(tmp_path / "checked")
    typo = {**GPT2, "config": {"n_layers": 2}}
    for _ in range(2):
        with pytest.raises(ModelSpecError, match="n_layers") as caught:
            check_models({"typo": typo}, record)
        with pytest.raises(ModelSpecError) as direct:
            check_spec("typo", typo)
        assert str(caught.value) == str(direct.value)
    assert not record.path.exists()


def test_editing_the_callables_module_checks_its_entry_again(tmp_path, monkeypatch):
    package = tmp_path / "mymodels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text("def net(width=4):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = {"source": "callable", "callable": "mymodels.nets:net", "kwargs": {"width": 8}}
    record = CheckRecord(tmp_path / "checked")
    assert check_models({"net": entry}, record) == ["net"]
    assert check_models({"net": entry}, record) == []
    (package / "nets.py").write_text("def net(depth=4):\n    pass\n")  # the kwarg is gone
    sys.modules.pop("mymodels.nets", None)
    with pytest.raises(ModelSpecError, match="width"):
        check_models({"net": entry}, record)


def test_a_support_table_is_checked_again_when_its_content_changes(tmp_path):
    table, record = tmp_path / "table.yaml", CheckRecord(tmp_path / "checked")
    table.write_text("name: t\nops: [aten.mm.default, aten.relu.default]\n")
    assert check_table(table, record) and not check_table(table, record)
    table.write_text("name: t\nops: [aten.mm.default, aten.rleu.default]\n")
    for _ in range(2):
        with pytest.raises(FuseError, match=f"support table {table}: unknown op 'aten.rleu.default'"):
            check_table(table, record)
    table.unlink()
    with pytest.raises(FuseError, match="table.yaml"):
        check_table(table, record)


def test_the_record_is_the_users_and_an_unwritable_one_only_costs_a_rerun(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_record().path == tmp_path / "cache" / "trainplan" / "start_checks"
    (tmp_path / "cache").write_text("a file where the folder should be")
    ran = []
    for _ in range(2):
        assert default_record().once({"x": 1}, [], lambda: ran.append(1))
    assert len(ran) == 2
