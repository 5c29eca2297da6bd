"""Report figures: every method drawn (over-budget ones at their own peak), plans before/after, and a
figure with nothing to draw saying why instead of showing empty axes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from trainplan.execute.plot import op_progress, plot_validation
from trainplan.partition.plot import plot_balance
from trainplan.pipeline.plot import plot_methods
from trainplan.plots import overhead_points, plot_schedule_comparison
from trainplan.precision.report import plot_study


def comparison(**extra: list) -> pd.DataFrame:
    """A stage at budget 0.5 as GPT-2's default study had it: every baseline over the budget or without a
    schedule, ours at the smallest feasible budget above the requested one (the figure that was empty)."""
    rows = {
        "model": ["gpt2"] * 5, "k": [2] * 5, "budget": ["0.5"] * 5, "budget_fraction": [0.5] * 5, "stage": [0] * 5,
        "method": ["no_recompute", "sqrt_checkpoint", "checkmate", "swap_only", "ours"],
        "status": ["infeasible", "infeasible", "infeasible", "infeasible", "feasible"],
        "time_s": [1.0, 1.4, None, None, 1.1],
        "overhead": [0.0, 0.4, None, None, 0.1],
        "peak_bytes": [300, 290, None, None, 240],
        "over_budget": [True, True, False, False, True],
        "memory_fraction": [1.0, 0.95, None, None, 0.7],
        "budget_bytes": [200, 200, 200, 200, 240],
        "requested_budget_bytes": [200] * 5,
        "requested_memory_fraction": [0.5] * 5,
        **extra,
    }
    return pd.DataFrame(rows)


def methods_table() -> pd.DataFrame:
    """Two settings of bench_pipeline's table: one method failed, one made ours' cuts (it shares ours' run), a
    rank over its budget."""
    rows = [("1f1b", "even_blocks", None, None, 7.5, 7.4, 8.0, 8.05, 0),
            ("1f1b", "ds_uniform", None, "no layers", None, None, None, None, None),
            ("1f1b", "ours", None, None, 6.3, 6.2, 7.1, 6.35, 1),
            ("gpipe", "exact_dp", None, None, 7.1, 6.5, 7.2, 6.49, 0),
            ("gpipe", "ours", "exact_dp", None, 7.1, 6.5, 7.2, 6.49, 0)]
    return pd.DataFrame([{"model": "gpt2", "budget": 0.7, "schedule": sched, "m": 4, "method": method,
                          "same_as": same, "error": error, "measured_step_s": measured, "measured_step_min_s": low,
                          "measured_step_max_s": high, "predicted_step_s": None if pred is None else pred - 0.1,
                          "predicted_step_comm_s": pred, "over_budget_ranks": over}
                         for sched, method, same, error, measured, low, high, pred, over in rows])


def test_the_methods_figure_draws_each_method_that_ran_per_setting(tmp_path):
    path = tmp_path / "methods.png"
    plot_methods(methods_table(), str(path))
    text = description(path)
    assert text.count("measured") == 4 and "ds_uniform" not in text  # the failed method draws nothing
    assert "gpt2 1f1b m=4 ours: measured 6.3 s, predicted 6.35 s with send/recv" in text
    assert "gpt2 gpipe m=4 ours: measured 7.1 s" in text  # shares the DP's run


def description(path: Path) -> str:
    return Image.open(path).info.get("Description", "")


def test_overhead_points_keep_every_schedule_over_budget_or_not():
    points = overhead_points(comparison()).set_index("method")
    assert points.drawable.to_dict() == {"no_recompute": True, "sqrt_checkpoint": True, "checkmate": False,
                                         "swap_only": False, "ours": True}
    within = overhead_points(comparison(status=["infeasible", "over_budget", "not_built", "unknown", "optimal"]))
    assert within.drawable.sum() == 3  # the status does not hide a schedule that has a time and a memory


def test_overhead_figure_draws_the_case_that_was_empty(tmp_path):
    path = tmp_path / "overhead.png"
    plot_schedule_comparison(comparison(), str(path))
    assert description(path) == "3 schedules drawn (3 over budget), 2 without a schedule"


@pytest.mark.parametrize(
    ("draw", "reason"),
    [
        (lambda p: plot_schedule_comparison(comparison().assign(time_s=None, overhead=None, memory_fraction=None), p),
         "no method produced"),
        (lambda p: plot_schedule_comparison(comparison().iloc[:0], p), "table is empty"),
        (lambda p: plot_study(pd.DataFrame(), p), "no model"),
        (lambda p: plot_validation({"model": "m", "k": 1, "budget_fraction": 0.5, "status": "failed",
                                    "reasons": ["stage 0: no schedule"], "stages": []}, pd.DataFrame(), p),
         "no stage was executed"),
        (lambda p: plot_balance({"model": "m", "k": 2, "budget_fraction": 0.5, "chosen_iteration": 0,
                                 "stop_reason": "none", "iterations": []}, p), "no iteration"),
        (lambda p: plot_methods(methods_table().assign(measured_step_s=None), p), "no method ran"),
    ],
)
def test_nothing_to_draw_says_why(tmp_path, draw, reason):
    path = tmp_path / "figure.png"
    draw(str(path))
    assert description(path).startswith("nothing to draw:") and reason in description(path)
    pixels = np.asarray(Image.open(path).convert("L"), dtype=float)
    assert pixels.std() > 5  # the banner's text is there


def test_op_progress_lines_up_a_plan_with_no_recompute():
    plan = [("compute", "a"), ("compute", "b"), ("swap_out", "a"), ("free", "a"), ("compute", "c"),
            ("swap_in", "a"), ("compute", "a"), ("compute", "d")]
    x = op_progress(plan)
    assert np.all(np.diff(x) > 0)
    assert x[[0, 1, 4, 7]].tolist() == [1.0, 2.0, 3.0, 4.0]  # first computes of a, b, c, d; a's recompute between
    assert op_progress([("compute", o) for o in "abcd"]).tolist() == [1.0, 2.0, 3.0, 4.0]
