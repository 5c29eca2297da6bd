"""The one budget parser: bytes with a unit, plain bytes, or a fraction of the no-recompute peak."""

import pytest

from trainplan.budget import Budget, BudgetError, budget_wildcard, format_bytes, parse_budget, wildcard_budget
from trainplan.schedule.stage_problem import budget_for, no_recompute_peak


@pytest.mark.parametrize(("text", "expected"), [
    ("2GiB", Budget(bytes=2 * 2**30)),
    ("1500MB", Budget(bytes=1_500_000_000)),
    ("512KiB", Budget(bytes=512 * 1024)),
    ("512 kib", Budget(bytes=512 * 1024)),
    ("1.5GiB", Budget(bytes=3 * 2**29)),
    ("1.1GB", Budget(bytes=1_100_000_000)),  # exact: no float round-off below the unit
    ("100B", Budget(bytes=100)),
    ("1500", Budget(bytes=1500)),
    (1500, Budget(bytes=1500)),
    (0, Budget(bytes=0)),
    (0.5, Budget(fraction=0.5)),
    ("0.5", Budget(fraction=0.5)),
    (1.0, Budget(fraction=1.0)),
    (".25", Budget(fraction=0.25)),
])
def test_accepted_budgets(text, expected):
    assert parse_budget(text) == expected
    assert parse_budget(expected) is expected


@pytest.mark.parametrize(("value", "says"), [
    ("2 GiBs", "unknown unit 'GiBs'"),
    ("2G", "unknown unit 'G'"),
    ("lots", "expected bytes"),
    ("-1GiB", "a byte count must be >= 0"),
    ("-0.5", "a fraction must be in (0, 1]"),
    ("", "expected bytes"),
    (1.5, "a fraction must be in (0, 1]"),
    ("1.5", "a fraction must be in (0, 1]"),
    (0.0, "a fraction must be in (0, 1]"),
    (float("nan"), "a fraction must be in (0, 1]"),
    (-3, "a byte count must be >= 0"),
    (True, "expected bytes"),
    (None, "expected bytes"),
])
def test_rejected_budgets_name_the_value_in_one_line(value, says):
    with pytest.raises(BudgetError) as err:
        parse_budget(value)
    assert says in str(err.value) and repr(value) in str(err.value) and "\n" not in str(err.value)


def test_budget_for_a_stage_problem():
    """Bytes as given; a fraction: fixed bytes + that share of the no-recompute peak above them."""
    raw = {"ops": [{"id": "a", "time": 1.0, "bytes": 300, "inputs": []},
                   {"id": "b", "time": 1.0, "bytes": 100, "inputs": ["a"]}],
           "fixed_bytes": 100, "budget_bytes": 0, "bandwidth": 1e9, "keep": ["b"]}
    peak = no_recompute_peak(raw)
    assert peak == 500
    assert budget_for(raw, "1KiB") == 1024 and budget_for(raw, 700) == 700
    assert budget_for(raw, 0.5) == budget_for(raw, "0.5") == 100 + 200
    assert budget_for(raw, 1.0) == peak


def test_format_bytes():
    assert [format_bytes(n) for n in (512, 1536, 3 * 2**29)] == ["512 B", "1.50 KiB", "1.50 GiB"]


@pytest.mark.parametrize(("entry", "wildcard", "budget"), [
    (0.5, "0.5", Budget(fraction=0.5)),  # fractions keep the paths they had (b0.5)
    (1, "1", Budget(fraction=1.0)),
    (1.0, "1.0", Budget(fraction=1.0)),
    (1e-3, "0.001", Budget(fraction=0.001)),
    ("2GiB", "2GiB", Budget(bytes=2 * 2**30)),
    (" 2 gib ", "2GiB", Budget(bytes=2 * 2**30)),  # one spelling: path-safe, one wildcard per budget
    ("1500MB", "1500MB", Budget(bytes=1_500_000_000)),
    ("1.50GiB", "1.5GiB", Budget(bytes=3 * 2**29)),
    ("2.GiB", "2GiB", Budget(bytes=2 * 2**30)),
    ("100b", "100B", Budget(bytes=100)),
])
def test_config_entry_to_wildcard_and_back(entry, wildcard, budget):
    assert budget_wildcard(entry) == wildcard and wildcard_budget(wildcard) == budget
    assert Budget.of_fields(budget.fields()) == budget


@pytest.mark.parametrize(("entry", "says"), [
    ("0.5", "bytes with a unit"),  # a fraction is a number; a string without a unit would be ambiguous
    ("1500", "bytes with a unit"),
    (2048, "a fraction must be in (0, 1]"),
    (1.5, "a fraction must be in (0, 1]"),
    ("2GX", "unknown unit 'GX'"),
    ("-1GiB", "a byte count must be >= 0"),
    (True, "bytes with a unit"),
    (None, "bytes with a unit"),
])
def test_bad_config_entries_name_the_entry(entry, says):
    with pytest.raises(BudgetError) as err:
        budget_wildcard(entry)
    assert says in str(err.value) and repr(entry) in str(err.value)


@pytest.mark.parametrize("text", ["2 GiB", "2gib", "1e-3", "b0.5", ""])
def test_a_wildcard_is_one_spelling(text):
    with pytest.raises(BudgetError, match="budget wildcard"):
        wildcard_budget(text)


def test_budget_fields_and_labels():
    assert Budget(bytes=2 * 2**30).fields() == {"budget": "2.00 GiB", "budget_fraction": None,
                                                "requested_budget_bytes": 2 * 2**30}
    assert Budget(fraction=0.5).fields() == {"budget": "0.5", "budget_fraction": 0.5, "requested_budget_bytes": None}
    assert str(Budget(bytes=1536)) == "1.50 KiB" and str(Budget(fraction=0.5)) == "0.5 of the no-recompute peak"
    assert Budget.of_fields({"budget_fraction": 0.7}) == Budget(fraction=0.7)  # a plan written before byte budgets
