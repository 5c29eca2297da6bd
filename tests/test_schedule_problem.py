"""Problem loading and validation."""

import json

import pytest

from trainplan.schedule import ProblemError, load_problem, problem_from_dict


def base() -> dict:
    return {
        "ops": [
            {"id": "x", "time": 0.001, "bytes": 100, "inputs": []},
            {"id": "a", "time": 0.002, "bytes": 50, "inputs": ["x"], "workspace": 10, "name": "aten.mm"},
            {"id": "g", "time": 0.003, "bytes": 30, "inputs": ["a", "x", "a"], "recompute": False, "swap": False},
        ],
        "fixed_bytes": 7,
        "budget_bytes": 1000,
        "bandwidth": 1e9,
        "keep": ["g"],
        "nodes": {"provenance": "ignored"},
    }


def test_valid_problem_defaults_and_extra_keys_ignored():
    p = problem_from_dict(base())
    assert [op.id for op in p.ops] == ["x", "a", "g"]
    assert p.ops[0].workspace == 0 and p.ops[0].recompute and p.ops[0].swap
    assert not p.ops[2].recompute and not p.ops[2].swap
    assert p.inputs[2] == (0, 1)  # duplicate input held once
    # floor: g reads x and a: 100 + 50 + 30, plus fixed 7
    assert p.floor_bytes == 7 + 180


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["ops"][1].update(inputs=["nope"]), "op 'a' input 'nope' is unknown"),
        (lambda d: d["ops"][1].update(inputs=["g"]), "op 'a' input 'g' is defined at or after it"),
        (lambda d: d["ops"][1].update(inputs=["a"]), "op 'a' input 'a' is defined at or after it"),
        (lambda d: d["ops"][2].update(id="a"), "op 'a': duplicate id"),
        (lambda d: d["ops"][0].update(bytes=-1), "op 'x' key 'bytes' must be >= 0"),
        (lambda d: d["ops"][0].update(bytes=1.5), "op 'x' key 'bytes' must be an integer"),
        (lambda d: d["ops"][0].pop("time"), "op 'x' missing key 'time'"),
        (lambda d: d["ops"][0].update(swap="yes"), "op 'x' key 'swap' must be true or false"),
        (lambda d: d.pop("bandwidth"), "missing top-level key 'bandwidth'"),
        (lambda d: d.update(bandwidth=0), "'bandwidth' must be > 0"),
        (lambda d: d.update(keep=["zz"]), "'keep' names unknown op 'zz'"),
        (lambda d: d["ops"][1].pop("id"), "ops[1] missing key 'id'"),
    ],
)
def test_invalid_problems_name_the_op_and_key(mutate, message):
    data = base()
    mutate(data)
    with pytest.raises(ProblemError) as err:
        problem_from_dict(data)
    assert message in str(err.value)


def test_load_problem_names_the_file(tmp_path):
    path = tmp_path / "p.json"
    data = base()
    data["ops"][0]["time"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(ProblemError, match=r"p\.json: op 'x' key 'time' must be >= 0"):
        load_problem(path)
    with pytest.raises(ProblemError, match="not found"):
        load_problem(tmp_path / "missing.json")


def test_round_trip_through_dict():
    p = problem_from_dict(base())
    assert problem_from_dict(p.to_dict()) == p


def kernel_with_outputs(**second: object) -> dict:
    """x; kernel k with further outputs k#1 and k#2; y."""
    ops = [{"id": "x", "time": 1, "bytes": 10, "inputs": []},
           {"id": "k", "time": 1, "bytes": 20, "inputs": ["x"], "workspace": 7},
           {"id": "k#1", "time": 0, "bytes": 3, "inputs": ["k", "x"], "recompute": False, "of": "k"},
           {"id": "k#2", "time": 0, "bytes": 4, "inputs": ["k", "x"], "recompute": False, "of": "k"},
           {"id": "y", "time": 1, "bytes": 5, "inputs": ["k", "k#2"]}]
    ops[3].update(second)
    return {"ops": ops, "budget_bytes": 1000, "bandwidth": 1.0, "keep": ["y"]}


def test_further_outputs_name_their_kernel():
    p = problem_from_dict(kernel_with_outputs())
    assert p.outputs_of == {1: [2, 3]} and p.ops[3].of == "k"
    assert problem_from_dict(p.to_dict()) == p


@pytest.mark.parametrize("second, message", [
    ({"of": "x"}, "must name the op right before it"),
    ({"of": "k#1"}, "must name the op right before it"),
    ({"inputs": ["x"]}, "must list it in 'inputs'"),
    ({"recompute": True}, "never recomputed alone"),
])
def test_a_further_output_must_follow_its_kernel_read_it_and_never_be_recomputed(second, message):
    with pytest.raises(ProblemError, match=f"op 'k#2' key 'of'.*{message}"):
        problem_from_dict(kernel_with_outputs(**second))
