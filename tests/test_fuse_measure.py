"""measure_fusion on the small CNN's forward groups: a group Inductor cannot compile is reported and left unfused,
and the fused forward (the other groups compiled) still matches the unfused forward; groups of another graph are
refused by name."""

from __future__ import annotations

import sys

import pandas as pd
import pytest

from trainplan.fuse import FuseError, inductor_table
from trainplan.fuse import measure as measure_module
from trainplan.fuse.forward import trace_forward
from trainplan.fuse.stage import fuse_forward


def test_a_group_inductor_cannot_compile_is_left_unfused(small_cnn, monkeypatch) -> None:
    built, _, _, tables = small_cnn
    ops = pd.DataFrame({"name": tables.nodes["name"], "time_s": 1e-4})
    result = fuse_forward(trace_forward(built), inductor_table(), tables.nodes, ops, 3000)
    chosen = measure_module.select_groups(result.groups, 2, 3)
    assert len(chosen) >= 2
    broken = int(chosen["group"].iloc[0])
    real = measure_module._compile
    calls = []

    def recording(gm, args):
        calls.append(gm)
        if len(calls) == 1:  # the first chosen group's submodule
            raise AssertionError("output spec mismatch: (injected)\nsecond line")
        return real(gm, args)

    monkeypatch.setattr(measure_module, "_compile", recording)
    table, summary = measure_module.measure_fusion(
        built, result.document, result.groups, min_ops=2, max_groups=3,
        repeats=1, warmup=0, whole_step=False, rtol=1e-4, atol=1e-4)
    assert summary["groups_failed"] == [{"group": broken, "n_ops": int(chosen["n_ops"].iloc[0]),
                                         "error": "AssertionError: output spec mismatch: (injected)"}]
    assert broken not in set(table["group"]) and len(table) == len(chosen) - 1
    assert summary["groups_measured"] == len(chosen) - 1 and summary["fused_forward_check"]["within_tolerance"]
    assert summary["graph"].startswith("forward") and summary["unfused_forward_s"] > 0
    assert summary["host_allocator"].startswith("glibc malloc keeps freed memory") or not sys.platform.startswith("linux")


def test_groups_of_another_graph_are_refused_by_name(small_cnn) -> None:
    built = small_cnn[0]
    doc = {"groups": [{"id": 0, "nodes": ["convolution", "convolution_backward"]}]}
    with pytest.raises(FuseError, match="group 0 names op 'convolution_backward' that its forward graph lacks"):
        measure_module.measure_fusion(built, doc, pd.DataFrame(), min_ops=2, max_groups=1, repeats=1, warmup=0,
                                      whole_step=False, rtol=1e-4, atol=1e-4)
