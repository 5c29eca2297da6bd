"""Gradients added into their running sums where they are made: the stage problem counts each only while its op
runs, runs it once, and gives the problem back as the stage runs alone (gradients held to the end)."""

from __future__ import annotations

import copy

from trainplan.budget import parse_budget
from trainplan.execute.plan import parse_plan
from trainplan.partition import partition_graph, pipeline_graph, range_tables
from trainplan.partition.stages import stage_stats
from trainplan.schedule import replay
from trainplan.schedule.baselines import no_recompute, no_recompute_events
from trainplan.schedule.budgeted_stages import StageBudget, budgeted_stage_problem
from trainplan.schedule.grad_accumulation import (accumulate_where_made, accumulated_ops, accumulated_storages,
                                                  accumulates, held_alone, tied_partials_as_zeros)
from trainplan.schedule.pipeline_hold import PipelineHold, gradient_sum_bytes, held_gradient_bytes
from trainplan.schedule.problem import problem_from_dict


def toy() -> dict:
    """A forward a -> b, backward gradients gb (read by gw), gw (a kernel with a further output gw#1) and ga."""
    ops = [{"id": "a", "time": 1.0, "bytes": 100, "phase": "forward", "storages": [1]},
           {"id": "b", "time": 1.0, "bytes": 10, "inputs": ["a"], "phase": "forward", "storages": [2]},
           {"id": "gb", "time": 1.0, "bytes": 10, "inputs": ["b"], "phase": "backward", "gradient": True,
            "storages": [3]},
           {"id": "gw", "time": 1.0, "bytes": 40, "inputs": ["gb", "a"], "phase": "backward", "gradient": True,
            "workspace": 8, "storages": [4]},
           {"id": "gw#1", "time": 0.0, "bytes": 8, "inputs": ["gw"], "phase": "backward", "gradient": True,
            "of": "gw", "recompute": False, "storages": [5]},
           {"id": "ga", "time": 1.0, "bytes": 5, "inputs": ["a"], "phase": "backward", "gradient": True,
            "storages": [6]}]
    return {"ops": ops, "fixed_bytes": 1000, "budget_bytes": 2000, "bandwidth": 1.0,
            "keep": ["gb", "gw", "gw#1", "ga"]}


def test_a_gradient_is_held_only_while_made_and_run_alone_it_is_held_again():
    p = toy()
    # gb is read by gw: it stays as it is (added at the end with the others)
    assert [op["id"] for op in accumulated_ops(p)] == ["gw", "gw#1", "ga"]
    q = accumulate_where_made(p)
    assert p == toy() and accumulates(q) and not accumulates(p)
    gw, extra = q["ops"][3], q["ops"][4]
    assert (gw["bytes"], gw["workspace"], gw["accumulated_bytes"], gw["recompute"]) == (0, 48, 40, False)
    assert (extra["bytes"], extra.get("workspace", 0), extra["accumulated_bytes"]) == (0, 0, 8)  # in gw's workspace
    assert accumulated_storages(q) == {4, 5, 6}
    # the sums: every gradient's bytes, moved or not
    assert gradient_sum_bytes(q) == gradient_sum_bytes(p) == 63
    assert held_gradient_bytes(q, 1) == 63 and held_gradient_bytes(p, 1) == 0 and held_gradient_bytes(p, 4) == 63
    # without recompute (b freed after gb): at gw, a and gb held and gw's 40 + 8 while it runs; gradients held to
    # the end, ga's 5 come on top of them
    assert no_recompute(problem_from_dict(q)).peak_bytes == 1000 + 100 + 10 + 48
    assert no_recompute(problem_from_dict(p)).peak_bytes == 1000 + 100 + 10 + 48 + 5
    alone = held_alone(q)
    assert alone["budget_bytes"] == 2000 + 53
    assert [(o["bytes"], o.get("workspace", 0)) for o in alone["ops"]] == [
        (o["bytes"], o.get("workspace", 0)) for o in p["ops"]]
    assert held_alone(p) is p


def test_a_tied_partial_read_as_zeros_is_aliased_by_a_plain_add_and_made_anew_by_a_row_sum():
    """A received partial (stand-in, 64 B) summed with the stage's own gradient ``g`` (64 B): a plain add
    (``plain_sum``) of zeros is ``g`` itself (alias, no bytes); ``embedding_grad_add`` into the zeros makes the
    table, held while it runs."""
    def problem(plain: bool) -> dict:
        ops = [{"id": "in:p", "time": 0.0, "bytes": 64, "boundary": True, "tied_partial": True, "storages": [1]},
               {"id": "g", "time": 1.0, "bytes": 64, "phase": "backward", "storages": [2]},
               {"id": "sum", "time": 1.0, "bytes": 64, "inputs": ["in:p", "g"] if plain else ["in:p"],
                "phase": "backward", "gradient": True, "storages": [3], **({"plain_sum": True} if plain else {})}]
        return {"ops": ops, "fixed_bytes": 0, "budget_bytes": 1000, "bandwidth": 1.0, "keep": ["sum"]}
    plain, rows = (accumulate_where_made(tied_partials_as_zeros(problem(p))) for p in (True, False))
    assert [op["bytes"] for op in plain["ops"]] == [op["bytes"] for op in rows["ops"]] == [0, 64, 0]
    assert plain["ops"][2]["alias"] and plain["ops"][2].get("workspace", 0) == 0
    assert not rows["ops"][2].get("alias") and rows["ops"][2]["workspace"] == rows["ops"][2]["accumulated_bytes"] == 64


def test_pipeline_stage_problems_sum_their_gradients_where_made_and_plans_read_them_alone(tiny_gpt2):
    built, _, _, tables = tiny_gpt2
    wte = built.module.transformer.wte.weight
    nodes = tables.nodes.assign(time_s=1e-6)
    graph = pipeline_graph(nodes, tables.tensors)
    ranges = range_tables(graph)
    stages = stage_stats(graph, partition_graph(graph, ranges, 2, tolerance=0.02).cuts)
    for m, summed in ((4, True), (1, False)):
        budget = StageBudget(parse_budget(0.5), 1e9, False, PipelineHold(2, m))
        problems = [budgeted_stage_problem(nodes, tables.tensors, st.nodes, budget, st.index) for st in stages]
        assert [accumulates(p) for p in problems] == [summed, summed]
        # the LM head's partial of the tied embedding, received by stage 0 as zeros: no bytes (any m)
        stand_ins = [op for op in problems[0]["ops"] if op.get("tied_partial")]
        assert [(op["bytes"], op["stand_in_bytes"]) for op in stand_ins] == [(0, wte.numel() * wte.element_size())]
    for p in problems:  # m = 1: nothing summed, nothing moved
        assert all("accumulated_bytes" not in op for op in p["ops"])
    budget = StageBudget(parse_budget(0.5), 1e9, False, PipelineHold(2, 4))
    plan_stages = []
    for st in stages:
        raw = budgeted_stage_problem(nodes, tables.tensors, st.nodes, budget, st.index)
        moved = sum(op.get("accumulated_bytes", 0) for op in raw["ops"])
        # the embedding's rows added into the zeros standing in for the LM head's partial (embedding_grad_add):
        # the embedding's gradient table, made, added into its sum and dropped (held while it runs)
        zeros = {op["id"] for op in raw["ops"] if "stand_in_bytes" in op}
        adds = [op for op in raw["ops"] if zeros.intersection(op.get("inputs", ()))]
        assert len(adds) == len(zeros) == (st.index == 0)
        table = wte.numel() * wte.element_size()
        assert all(not op.get("alias") and op["bytes"] == 0 and op["accumulated_bytes"] == table <= op["workspace"]
                   for op in adds)
        # every gradient the stage makes and no op of it reads (here: all of them, the tied partial too)
        assert moved == gradient_sum_bytes(raw) > 0
        events = no_recompute_events(problem_from_dict({**raw, "budget_bytes": 2**62}))
        plan_stages.append({"index": st.index, "nodes": st.nodes, "problem": raw,
                            "schedule": {"events": [list(e) for e in events], "time": 1.0, "peak_bytes": 1,
                                         "budget_bytes": raw["budget_bytes"]}})
        # the same events run alone hold each gradient to the end: their peak, at most the sums more
        summed_peak = replay(problem_from_dict({**raw, "budget_bytes": 2**62}), events).peak_bytes
        alone = held_alone(copy.deepcopy(raw))
        alone_peak = replay(problem_from_dict({**alone, "budget_bytes": 2**62}), events).peak_bytes
        stand_in = sum(op.get("stand_in_bytes", 0) for op in raw["ops"])
        assert summed_peak < alone_peak <= summed_peak + moved + stand_in
        assert alone["budget_bytes"] == raw["budget_bytes"] + moved + stand_in
    parsed = parse_plan({"stages": plan_stages})
    for st, raw in zip(parsed, plan_stages):  # a plan's stages are read as they run alone: the partial received
        assert not accumulates(st.raw) and st.problem.budget_bytes == raw["problem"]["budget_bytes"] + sum(
            op.get("accumulated_bytes", 0) + op.get("stand_in_bytes", 0) for op in raw["problem"]["ops"])
        assert st.held_bytes == st.problem.budget_bytes - raw["problem"]["budget_bytes"]
        assert all("stand_in_bytes" not in op for op in st.raw["ops"])
    assert [op["bytes"] for op in parsed[0].raw["ops"] if op.get("tied_partial")] == [wte.numel() * wte.element_size()]
