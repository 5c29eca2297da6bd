"""The layout stage on one model: plan on measured and on predicted costs, execute every plan and baseline on
the real training step, check gradients, and put predicted and measured step times side by side."""

from __future__ import annotations

import copy
from typing import Any

import pandas as pd

from trainplan.layout.adopt import choose, confirm
from trainplan.layout.build import build_problem
from trainplan.layout.execute import Runnable, apply_layouts, check_gradients, gradient_reference, time_steps
from trainplan.layout.measure import device_facts
from trainplan.layout.predict import fit, outside_sweep, predict, score
from trainplan.layout.settings import timing_of
from trainplan.layout.solve import plan_time, solve_all
from trainplan.models import BuiltModel
from trainplan.stats import paired_speedup_ci
from trainplan.timing import keep_freed_memory


def run_layout(built: BuiltModel, tables: dict[str, pd.DataFrame], sweep: pd.DataFrame,
               settings: dict[str, Any], solver: dict[str, Any], seed: int, device: str = "cpu"
               ) -> tuple[dict[str, Any], dict[str, Any], pd.DataFrame]:
    """Plans (exact on measured costs with every baseline, exact on predicted conv costs), their execution, the
    adopted plan (``trainplan.layout.adopt``: the exact plan only where it measured faster than the fastest single
    layout beyond noise, confirmed on fresh rounds) and the predictor's scores on this model's convs. Returns
    (plan document, execution document, predictions). ``built`` must be on ``device`` already, where its steps
    are timed.
    Keeps freed host memory for the rest of the process (``keep_freed_memory``), as the profile does."""
    allocator = keep_freed_memory()
    layouts = list(settings["layouts"])
    convs, groups, edges = tables["convs"], tables["groups"], tables["edges"]
    limit, workers = float(solver["time_limit_s"]), int(solver["workers"])
    measured = build_problem(built.name, convs, groups, edges, layouts)
    plan = solve_all(measured, limit, workers, int(solver["seed"]))
    model = fit(sweep, layouts, seed)
    pred_conv = predict(model, convs, layouts)
    predicted = build_problem(built.name, convs, groups, edges, layouts, conv_time=pred_conv)
    pred_plan = solve_all(predicted, limit, workers, int(solver["seed"]))
    candidates = {"planned": plan.layouts, "predicted_plan": pred_plan.layouts,
                  **{name: base["layouts"] for name, base in plan.extra["baselines"].items()}}
    distinct: dict[tuple[tuple[str, str], ...], str] = {}
    runs = []
    for name, lay in candidates.items():
        key = tuple(sorted(lay.items()))
        if key not in distinct:
            distinct[key] = name
            runs.append(apply_layouts(built.module, lay, name))
    reference = Runnable("unmodified", copy.deepcopy(built.module), [])
    tol = settings["tolerances"]
    exact = gradient_reference(reference.module, built.batch, built.loss_fn, float(tol["grad_atol"]))
    checks = {r.name: check_gradients(exact, r.module, built.batch, built.loss_fn,
                                      float(tol["grad_rtol"]), float(tol["grad_atol"])) for r in runs}
    timing = timing_of(settings, "step_repeats", device)
    steps = time_steps([reference, *runs], built.batch, built.loss_fn, timing)
    anchor_name = distinct[tuple(sorted(candidates["all_nchw"].items()))]
    anchor_t = plan_time(measured, candidates["all_nchw"])
    rows = {}
    for name, lay in candidates.items():
        ran = distinct[tuple(sorted(lay.items()))]
        t_problem = plan_time(measured, lay)
        rows[name] = {"ran_as": ran, "problem_time_s": t_problem,
                      "predicted_step_s": steps[anchor_name]["median_s"] + t_problem - anchor_t,
                      "measured_step_s": steps[ran]["median_s"], "min_step_s": steps[ran]["min_s"],
                      "max_step_s": steps[ran]["max_s"], "samples_s": steps[ran]["samples_s"],
                      "n_nhwc": sum(v == "nhwc" for v in lay.values()),
                      "gradients": checks[ran]}
    rows["unmodified"] = {"ran_as": "unmodified", "measured_step_s": steps["unmodified"]["median_s"],
                          "min_step_s": steps["unmodified"]["min_s"], "max_step_s": steps["unmodified"]["max_s"],
                          "samples_s": steps["unmodified"]["samples_s"]}
    # the single layout that measured fastest (the modelled best_single may not be it)
    fastest_single = min((k for k in rows if k.startswith("all_")), key=lambda k: rows[k]["measured_step_s"])
    best_single = rows[fastest_single]["measured_step_s"]
    ci = paired_speedup_ci(rows[fastest_single]["samples_s"], rows["planned"]["samples_s"], seed)
    adopted, reason = choose(ci, fastest_single, rows["planned"]["gradients"]["ok"])
    fresh: dict[str, list[float]] = {}
    if adopted != fastest_single:  # fresh rounds of the two, so the choice does not flatter the winner
        by_name = {r.name: r for r in runs}
        pair = (fastest_single, adopted)
        timed = time_steps([by_name[rows[n]["ran_as"]] for n in pair], built.batch, built.loss_fn, timing)
        fresh = {n: timed[rows[n]["ran_as"]]["samples_s"] for n in pair}
    adoption = confirm(adopted, reason, fastest_single, fresh, seed)
    held_out = {**score(model, convs, layouts), "outside_sweep": outside_sweep(sweep, convs)}
    execution = {
        "model": built.name, "device": device_facts(device), "clock": settings["clock"], "threads": settings["threads"],
        "host_allocator": allocator,
        "load_average": steps["_load"], "under_load": steps["_load"]["max"] > 1.0,
        "configs": rows,
        "speedup_vs_all_nchw": rows["all_nchw"]["measured_step_s"] / rows["planned"]["measured_step_s"],
        "measured_best_single": fastest_single,
        "speedup_vs_best_single": best_single / rows["planned"]["measured_step_s"],
        "speedup_vs_best_single_ci95": list(ci),  # paired bootstrap over the alternating rounds
        "planned_faster_than_best_single": ci[0] > 1.0,  # the whole interval above 1: faster beyond noise
        "planned_slower_than_best_single": ci[1] < 1.0,  # the whole interval below 1: slower beyond noise
        "adopted": adoption.to_dict(),
        "predictor": held_out,
        "regret": {"problem_time_s": plan_time(measured, pred_plan.layouts) - plan.time,
                   "measured_step_s": rows["predicted_plan"]["measured_step_s"] - rows["planned"]["measured_step_s"]},
        "gradients_ok": all(c["ok"] for c in checks.values()),
    }
    plan_doc = {**plan.to_dict(), "problem": measured.to_dict(), "predicted_plan": pred_plan.to_dict(),
                "adopted": {"config": adopted, "layouts": candidates[adopted], "reason": reason,
                            "validated_by": "measured training step against the fastest single layout (execution.json "
                                            "'adopted'), gradients checked against the unmodified step"}}
    pred = pred_conv.rename(columns=lambda c: f"pred_{c}").reset_index(names="conv")
    for lay in layouts:
        pred[f"meas_{lay}"] = (convs[f"fwd_{lay}"] + convs[f"bwd_{lay}"]).to_numpy()
        pred[f"chosen_{lay}"] = [plan.layouts[c] == lay for c in pred.conv]
    return plan_doc, execution, pred
