"""Offset arithmetic: Spark JSON, G coverage, new-generation starts."""

from __future__ import annotations

import pytest

from eop_spark.contract.offsets import (
    EARLIEST,
    LATEST,
    covers,
    lagging,
    parse_spark_json,
    starting_offsets,
    to_spark_json,
)

T0, T1, U0 = ("t", 0), ("t", 1), ("u", 0)


def test_spark_json_round_trips_sorted() -> None:
    offsets = {T1: 5, T0: 3, U0: 0}
    text = to_spark_json(offsets)
    assert text == '{"t":{"0":3,"1":5},"u":{"0":0}}'
    assert parse_spark_json(text) == offsets


@pytest.mark.parametrize("text", ["[]", '{"t": 3}'])
def test_spark_json_rejects_other_shapes(text: str) -> None:
    with pytest.raises(ValueError):
        parse_spark_json(text)


def test_covers_and_lagging() -> None:
    end = {T0: 10, T1: 20}
    assert covers({T0: 10, T1: 25}, end)
    assert not covers({T0: 10}, end)
    assert lagging({T0: 10, T1: 15}, end) == {T1: 20}
    assert lagging({}, end) == end


def test_new_generation_resumes_seen_partitions_from_g_and_others_from_the_spec() -> None:
    partitions = [T0, T1, U0]
    assert starting_offsets(partitions, {T0: 7}, "earliest") == {T0: 7, T1: EARLIEST, U0: EARLIEST}
    assert starting_offsets(partitions, {T0: 7}, "latest") == {T0: 7, T1: LATEST, U0: LATEST}
    spec = '{"t": {"0": 1, "1": 4}}'
    # G wins over the spec; partitions missing from the spec JSON start at earliest.
    assert starting_offsets(partitions, {T0: 7}, spec) == {T0: 7, T1: 4, U0: EARLIEST}
