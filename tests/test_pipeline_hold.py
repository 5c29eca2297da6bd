"""What a pipeline stage holds besides its running micro-batch: the stash at its schedule's split, the gradients it
sums across micro-batches, and the rank's budget that a stage problem keeps them from."""

from __future__ import annotations

import random

import pytest

from trainplan.budget import parse_budget
from trainplan.memory_model import allocation_bytes
from trainplan.partition import partition_graph, pipeline_graph, range_tables
from trainplan.partition.stages import stage_stats
from trainplan.schedule.baselines import no_recompute_events
from trainplan.schedule.budgeted_stages import StageBudget, budgeted_stage_problem
from trainplan.schedule.pipeline_hold import (PipelineHold, StageHold, carrier_bytes, carriers_held, forward_carriers,
                                              gradient_sum_bytes, in_flight, largest_stash, loss_bytes,
                                              others_held, pending_gradient_sends, receive_buffers,
                                              split_position, stash_bytes)
from trainplan.schedule.problem import problem_from_dict


def toy() -> dict:
    ops = [{"id": "a", "time": 1.0, "bytes": 100, "phase": "forward"},
           {"id": "b", "time": 1.0, "bytes": 10, "inputs": ["a"], "phase": "forward"},
           {"id": "c", "time": 1.0, "bytes": 1, "inputs": ["b"], "phase": "forward"},
           {"id": "gc", "time": 1.0, "bytes": 2, "inputs": ["c"], "phase": "backward"},
           {"id": "gb", "time": 1.0, "bytes": 7, "inputs": ["gc", "b"], "phase": "backward", "gradient": True}]
    return {"ops": ops, "fixed_bytes": 1000, "budget_bytes": 0, "bandwidth": 1.0, "keep": ["gb"]}


def test_the_stash_is_what_the_schedule_holds_at_its_first_backward_event():
    p = toy()
    kept = [("compute", "a"), ("compute", "b"), ("compute", "c"), ("compute", "gc"), ("compute", "gb")]
    assert split_position(p, kept) == 3
    assert stash_bytes(p, kept) == 111  # a, b, c resident; fixed bytes apart
    freed = [("compute", "a"), ("compute", "b"), ("free", "a"), ("compute", "c"), ("compute", "gc"),
             ("compute", "gb")]
    assert stash_bytes(p, freed) == 11
    swapped = [("compute", "a"), ("compute", "b"), ("free", "a"), ("swap_out", "b"), ("free", "b"),
               ("compute", "c"), ("compute", "gc"), ("swap_in", "b"), ("compute", "gb")]
    assert stash_bytes(p, swapped) == 1  # b's host copy holds no device bytes
    copied = [("compute", "a"), ("compute", "b"), ("free", "a"), ("swap_out", "b"), ("compute", "c"),
              ("compute", "gc"), ("compute", "gb")]
    assert stash_bytes(p, copied) == 11  # swapped out but not freed: still resident
    no_phase = {**p, "ops": [{k: v for k, v in op.items() if k != "phase"} for op in p["ops"]]}
    assert split_position(no_phase, kept) == 5 and stash_bytes(no_phase, kept) == 120


def test_a_ranks_peak_adds_the_sums_and_the_other_in_flight_stashes():
    assert [in_flight(s, 4, 8) for s in range(4)] == [4, 3, 2, 1]
    assert [in_flight(s, 4, 2) for s in range(4)] == [2, 2, 2, 1]
    assert [in_flight(s, 4, 8, "gpipe") for s in range(4)] == [8] * 4  # every forward before the first backward
    assert [PipelineHold(3, 5, "gpipe").in_flight(s) for s in range(3)] == [5] * 3
    with pytest.raises(ValueError, match="'interleaved'"):
        PipelineHold(2, 4, "interleaved")
    hold = StageHold(in_flight=3, sums=50, no_recompute_stash=20, carriers=7)
    assert hold.reserve == 50 + 7 + 2 * 20
    # two pending sends of 30 B: one in place of a stash (30 > 20), one on top
    assert StageHold(3, 50, 20, 7, pending=3, into=30).reserve == 50 + 7 + 2 * 30 + 30
    assert carriers_held(4, out=8, into=4) == 4 * 8 + 4
    # forward carriers: 1F1B's in-flight ones and one sent; GPipe and the multi-stage runtime keep every send
    assert [forward_carriers(3, 8, schedule) for schedule in ("1f1b", "gpipe", "interleaved1f1b")] == [4, 8, 8]
    assert receive_buffers(8, out=8, into=4) == 8 * 12  # one per micro-batch and direction
    # gradient carriers sent back and not yet waited on: GPipe waits after its last backward; 1F1B one in cool-down
    assert [pending_gradient_sends(s, 4, 8, "gpipe") for s in range(4)] == [7] * 4
    assert [PipelineHold(4, 8).pending_gradient_sends(s) for s in range(4)] == [1, 1, 1, 0]
    assert [PipelineHold(4, 8, "interleaved1f1b", 2).pending_gradient_sends(s) for s in range(4)] == [7] * 4
    assert [pending_gradient_sends(s, 2, 1) for s in range(2)] == [0, 0]
    assert gradient_sum_bytes(toy()) == 7
    assert not PipelineHold(2, 1).accumulates and PipelineHold(2, 2).accumulates


def most_held(n: int, stash: int, pending: int, into: int) -> int:
    """Brute force: the most x stashes and y pending sends hold, x <= n - 1, y <= pending, x + y <= max(n - 1,
    pending) (a micro-batch is stashed or pending, never both; see ``others_held``)."""
    return max(x * stash + y * into for x in range(n) for y in range(pending + 1) if x + y <= max(n - 1, pending))


@pytest.mark.parametrize("seed", range(10))
def test_other_micro_batches_hold_their_stash_or_their_pending_send(seed):
    rng = random.Random(seed)
    for _ in range(50):
        n, pending, into = rng.randint(1, 8), rng.randint(0, 8), rng.randint(0, 50)
        stash = rng.randint(0, 50)
        assert others_held(n, stash, pending, into) == most_held(n, stash, pending, into)
        if n >= 2:
            room = rng.randint(0, 500)
            fits = [s for s in range(600) if others_held(n, s, pending, into) <= room]
            largest = largest_stash(room, n, pending, into)
            assert largest == max(fits) if fits else largest < 0


def test_stage_problems_mark_every_gradient_once_and_the_tied_partial_where_it_is_made(tiny_gpt2):
    built, traced, flat, tables = tiny_gpt2
    nodes = tables.nodes.assign(time_s=1e-6)
    graph = pipeline_graph(nodes, tables.tensors)
    ranges = range_tables(graph)
    stages = stage_stats(graph, partition_graph(graph, ranges, 2, tolerance=0.02).cuts)
    budget = StageBudget(parse_budget(0.5), 1e9, False, PipelineHold(2, 4))
    problems = [budgeted_stage_problem(nodes, tables.tensors, st.nodes, budget, st.index) for st in stages]
    params = {id(p): p for p in built.module.parameters()}.values()  # the tied embedding once
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    wte = built.module.transformer.wte.weight
    # every parameter's gradient and the LM head's partial of the tied embedding, summed by the last stage
    assert sum(gradient_sum_bytes(p) for p in problems) == param_bytes + wte.numel() * wte.element_size()
    assert [loss_bytes(p) for p in problems] == [0, 4]  # the loss: a float32 scalar, on the last stage
    # one link: what stage 0 sends forward and receives back is what stage 1 receives and sends back; the tied
    # partial is not in it
    (out0, in0), (out1, in1) = (carrier_bytes(p) for p in problems)
    assert in0 == out1 == 0 and out0 == in1 > 0
    assert any(op.get("tied_partial") for op in problems[0]["ops"])
    assert out0 < wte.numel() * wte.element_size()
    for st, raw in zip(stages, problems):
        hold = raw["pipeline"]
        assert hold["in_flight"] == 2 - st.index
        assert hold["gradient_sum_bytes"] == gradient_sum_bytes(raw)
        assert hold["no_recompute_stash_bytes"] == stash_bytes(
            raw, no_recompute_events(problem_from_dict({**raw, "budget_bytes": 2**62})))
        stashes = (hold["in_flight"] - 1) * hold["no_recompute_stash_bytes"]
        # 0.5 of the rank's activation peak, above what it must hold: parameters, inputs, gradient sums, carriers
        assert hold["rank_budget_bytes"] == int(raw["fixed_bytes"] + 0.5 * (
            raw["no_recompute_peak_bytes"] + stashes - raw["fixed_bytes"])) + hold["gradient_sum_bytes"] + hold[
            "carrier_bytes"]
        assert raw["budget_bytes"] == max(0, hold["rank_budget_bytes"] - hold["reserve_bytes"])


@pytest.mark.parametrize("k", [1, 2])
def test_a_byte_budget_is_the_ranks_and_one_stage_has_no_hold(tiny_gpt2, k):
    _, _, _, tables = tiny_gpt2
    nodes = tables.nodes.assign(time_s=1e-6)
    budget = StageBudget(parse_budget("1MB"), 1e9, False, PipelineHold(k, 4))
    raw = budgeted_stage_problem(nodes, tables.tensors, list(nodes.name) if k == 1 else list(nodes.name[:50]),
                                 budget, 0)
    if k == 1:
        assert "pipeline" not in raw and raw["budget_bytes"] == 10**6
    else:
        assert raw["pipeline"]["rank_budget_bytes"] == 10**6
        assert raw["budget_bytes"] == max(0, 10**6 - raw["pipeline"]["reserve_bytes"])


def test_a_rank_problem_weighs_storages_at_the_devices_allocation_sizes(tiny_gpt2):
    """allocation='cpu' (the schedule, balance and pipeline rules pass the device's type): each op's bytes and the
    fixed bytes are the pages and objects the process meter sees, so the rank's carriers, sums and stashes are too."""
    _, _, _, tables = tiny_gpt2
    nodes = tables.nodes.assign(time_s=1e-6)
    stage_nodes = list(nodes.name[:50])
    plain, weighed = (budgeted_stage_problem(nodes, tables.tensors, stage_nodes,
                                             StageBudget(parse_budget(0.5), 1e9, False, PipelineHold(2, 4), allocation),
                                             0) for allocation in (None, "cpu"))
    assert weighed["allocation"] == "cpu" and "allocation" not in plain
    assert [op["id"] for op in plain["ops"]] == [op["id"] for op in weighed["ops"]]
    for raw_op, op in zip(plain["ops"], weighed["ops"]):  # an op of no bytes (a view) weighs none; else its storages'
        assert op["bytes"] == raw_op["bytes"] == 0 or (
            op["bytes"] >= allocation_bytes("cpu", raw_op["bytes"]) > raw_op["bytes"])
    assert weighed["fixed_bytes"] > plain["fixed_bytes"]
    assert weighed["pipeline"]["carrier_bytes"] > plain["pipeline"]["carrier_bytes"]
    assert weighed["no_recompute_peak_bytes"] > plain["no_recompute_peak_bytes"]


def test_a_gpipe_rank_budget_holds_every_micro_batchs_stash(tiny_gpt2):
    """Planned for GPipe, each rank's problem keeps m - 1 other stashes out of the running micro-batch's budget
    (1F1B: min(k - s, m) - 1)."""
    _, _, _, tables = tiny_gpt2
    nodes = tables.nodes.assign(time_s=1e-6)
    graph = pipeline_graph(nodes, tables.tensors)
    stages = stage_stats(graph, partition_graph(graph, range_tables(graph), 2, tolerance=0.02).cuts)
    for schedule, n in (("1f1b", [2, 1]), ("gpipe", [4, 4])):
        budget = StageBudget(parse_budget(0.7), 1e9, False, PipelineHold(2, 4, schedule), "cpu")
        for st, want in zip(stages, n):
            raw = budgeted_stage_problem(nodes, tables.tensors, st.nodes, budget, st.index)
            hold = raw["pipeline"]
            assert (hold["schedule"], hold["in_flight"]) == (schedule, want)
            assert hold["reserve_bytes"] == hold["gradient_sum_bytes"] + hold["carrier_bytes"] + most_held(
                want, hold["no_recompute_stash_bytes"], hold["pending_gradient_sends"], hold["carrier_in_bytes"])
            assert hold["pending_gradient_sends"] == PipelineHold(2, 4, schedule).pending_gradient_sends(st.index)


def test_interleaved_1f1b_holds_what_torchs_order_holds():
    """Interleaved1F1B, v stages per rank: per stage the most micro-batches in flight in the order torch's
    schedule gives each rank (k=4 on 2 ranks, m=4: stage 0 runs 4 forwards before its first backward, like
    1F1B; m=2: [2, 2, 2, 1], unlike 1F1B (which needs m >= k) and GPipe; k=8 on 2 ranks at m=8 holds half of
    1F1B's on the first stages). A rank problem planned for it keeps that many stashes out of its budget."""
    assert [in_flight(s, 4, 4, "interleaved1f1b", 2) for s in range(4)] == [4, 3, 2, 1]
    assert [in_flight(s, 4, 2, "interleaved1f1b", 2) for s in range(4)] == [2, 2, 2, 1]
    assert [in_flight(s, 8, 8, "interleaved1f1b", 4) for s in range(8)] == [4, 4, 4, 3, 2, 2, 2, 1]
    # its runtime waits on every send at the step's end: m - 1 gradient sends pending at the last backward
    assert [pending_gradient_sends(s, 4, 2, "interleaved1f1b", 2) for s in range(4)] == [1, 1, 1, 1]
    assert PipelineHold(4, 2, "interleaved1f1b", 2).in_flight(3) == 1
    for args, message in (((4, 4, "interleaved1f1b", 1), "1 stage\\(s\\) per rank does not fit k=4"),
                          ((4, 4, "interleaved1f1b", 4), "4 stage\\(s\\) per rank does not fit k=4"),
                          ((4, 4, "1f1b", 2), "1f1b runs one stage per rank, not 2"),
                          ((4, 5, "interleaved1f1b", 2), "m=5 is not a multiple of its 2 rounds")):
        with pytest.raises(ValueError, match=message):
            PipelineHold(*args)


def test_an_interleaved_rank_problem_keeps_its_in_flight_stashes_out(tiny_gpt2):
    _, _, _, tables = tiny_gpt2
    nodes = tables.nodes.assign(time_s=1e-6)
    graph = pipeline_graph(nodes, tables.tensors)
    stages = stage_stats(graph, partition_graph(graph, range_tables(graph), 4, tolerance=0.02).cuts)
    budget = StageBudget(parse_budget(0.7), 1e9, False, PipelineHold(4, 2, "interleaved1f1b", 2), "cpu")
    for st, want in zip(stages, [2, 2, 2, 1]):
        hold = budgeted_stage_problem(nodes, tables.tensors, st.nodes, budget, st.index)["pipeline"]
        assert (hold["schedule"], hold["stages_per_rank"], hold["in_flight"]) == ("interleaved1f1b", 2, want)
        assert hold["reserve_bytes"] == hold["gradient_sum_bytes"] + hold["carrier_bytes"] + most_held(
            want, hold["no_recompute_stash_bytes"], hold["pending_gradient_sends"], hold["carrier_in_bytes"])
