"""The verify report: each kind of discrepancy counted right, and a report read at a glance."""

from __future__ import annotations

import pytest

from eop_spark.contract.errors import EXIT_DISCREPANCIES, EXIT_OK, ConfigError
from eop_spark.verify.ranges import chosen
from eop_spark.verify.report import EXAMPLES, SHOWN_BYTES, Group, Range, Report, Tally, shown


def group(expected: int, found: int, key: bytes | None = b"k", value: bytes = b"v") -> Group:
    return Group(key, value, expected, found, ("in-0@3",), ("out-1@7",) * found)


@pytest.mark.parametrize(
    ("expected", "found", "counts"),
    [
        (1, 2, (1, 0, 0)),  # a record written twice
        (2, 5, (3, 0, 0)),
        (0, 1, (0, 0, 1)),  # nothing of it expected: unexpected, not a duplicate
        (0, 2, (0, 0, 2)),
        (1, 0, (0, 1, 0)),
        (3, 1, (0, 2, 0)),
        (2, 2, (0, 0, 0)),
    ],
)
def test_each_group_counts_as_duplicates_missing_or_unexpected(
    expected: int, found: int, counts: tuple[int, int, int]
) -> None:
    tally = Tally.of([group(expected, found)])
    assert (tally.duplicates, tally.missing, tally.unexpected) == counts
    assert tally.clean == (counts == (0, 0, 0))


def test_a_wrong_value_is_one_missing_and_one_unexpected_record() -> None:
    tally = Tally.of([group(1, 0, value=b"count=3"), group(0, 1, value=b"count=4")])
    assert (tally.duplicates, tally.missing, tally.unexpected) == (0, 1, 1)


def test_the_tally_keeps_the_first_examples_of_each_kind() -> None:
    tally = Tally.of(group(1, 2, key=f"k{i}".encode()) for i in range(EXAMPLES + 3))
    assert tally.duplicates == EXAMPLES + 3
    assert [g.key for g in tally.examples["duplicates"]] == [
        f"k{i}".encode() for i in range(EXAMPLES)
    ]
    assert tally.examples["missing"] == tally.examples["unexpected"] == []


def report(tally: Tally) -> Report:
    source = Range({("in", 0): 0}, {("in", 0): 10}, "from the earliest offsets to G")
    sink = Range({("out", 0): 0}, {("out", 0): 12}, "sink")
    return Report("ns.p", source, "out", sink, 10, 10, 11, tally)


def test_a_clean_report_exits_0_and_says_ok() -> None:
    text = report(Tally()).render()
    assert report(Tally()).exit_code == EXIT_OK
    assert "duplicates                 0" in text
    assert text.splitlines()[-1].startswith("OK:")
    assert "in-0 [0, 10)" in text and "out: out-0 [0, 12)" in text


def test_a_report_with_a_duplicate_names_its_key_and_where_both_copies_are() -> None:
    bad = report(Tally.of([Group(b"k7", b"v7", 1, 2, ("in-0@7",), ("out-0@7", "out-0@11"))]))
    text = bad.render()
    assert bad.exit_code == EXIT_DISCREPANCIES == 7
    assert "duplicates                 1" in text
    assert (
        "key='k7' value='v7': expected 1, found 2 at out-0@7, out-0@11; from input in-0@7" in text
    )
    assert text.splitlines()[-1].startswith("DISCREPANCIES")


def test_keys_and_values_are_shown_as_text_hex_or_null() -> None:
    assert shown(b"abc") == "'abc'"
    assert shown(b"\xff\x00") == "0xff00"
    assert shown(None) == "null"
    assert shown(b"x" * 500).endswith("...") and len(shown(b"x" * 500)) == SHOWN_BYTES


EARLIEST = {("in", 0): 5, ("in", 1): 0}
LATEST = {("in", 0): 50, ("in", 1): 40}
G = {("in", 0): 30, ("in", 1): 20}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, G),
        ("earliest", EARLIEST),
        ("latest", LATEST),
        ('{"in": {"1": 33}}', {("in", 0): 30, ("in", 1): 33}),
        ('{"in": {"0": -1, "1": -2}}', {("in", 0): 50, ("in", 1): 0}),
    ],
)
def test_offsets_given_as_words_or_json_keep_the_default_for_other_partitions(
    given: str | None, expected: dict[tuple[str, int], int]
) -> None:
    assert chosen("--to-offsets", given, G, EARLIEST, LATEST) == expected


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("soon", "--to-offsets: expected earliest, latest or offsets JSON"),
        ('{"other": {"0": 1}}', "--to-offsets: other-0 is not one of the partitions verified"),
        ('{"in": {"0": -5}}', "--to-offsets: offset -5 of in-0 is not an offset"),
    ],
)
def test_bad_offsets_name_the_option(given: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        chosen("--to-offsets", given, G, EARLIEST, LATEST)
