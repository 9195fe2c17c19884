"""Offset arithmetic: Spark JSON, G coverage, new-generation starts, coordinated decisions."""

from __future__ import annotations

import pytest

from eop_spark.offsets import (
    EARLIEST,
    LATEST,
    BatchAction,
    batch_marker,
    covers,
    decide_batch,
    lagging,
    marked_batch,
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


def test_markers_name_the_batch_of_this_query_only() -> None:
    metadata = {T0: batch_marker("q1", 4), T1: batch_marker("q1", 5)}
    assert marked_batch(metadata, [T0, T1], "q1") == 4
    assert marked_batch(metadata, [T0, T1], "q2") is None
    assert marked_batch({T0: batch_marker("q1", 4)}, [T0, T1], "q1") is None
    assert marked_batch({T0: "something else"}, [T0], "q1") is None


def test_coordinated_runs_a_batch_that_starts_where_g_is() -> None:
    decision = decide_batch({T0: 10}, {T0: 10}, {T0: 20}, batch_id=3)
    assert decision.action == BatchAction.RUN and decision.detail == ""


def test_coordinated_skips_a_replayed_batch() -> None:
    assert decide_batch({T0: 20}, {T0: 10}, {T0: 20}, batch_id=3).action == BatchAction.SKIP
    # By marker, even when the batch read nothing new (a watermark-only batch).
    replayed = decide_batch({T0: 20}, {T0: 20}, {T0: 20}, batch_id=3, committed_batch=3)
    assert replayed.action == BatchAction.SKIP


def test_coordinated_runs_a_batch_without_input_that_g_has_not_marked() -> None:
    # Spark emits windows closed by the watermark in batches that read no input.
    decision = decide_batch({T0: 20}, {T0: 20}, {T0: 20}, batch_id=4, committed_batch=3)
    assert decision.action == BatchAction.RUN


def test_coordinated_refuses_a_batch_g_has_partly_passed() -> None:
    decision = decide_batch({T0: 15, T1: 5}, {T0: 10, T1: 5}, {T0: 20, T1: 8}, batch_id=3)
    assert decision.action == BatchAction.CONFLICT
    assert '{"t":{"0":15}}' in decision.detail


def test_coordinated_runs_new_partitions_and_reports_g_behind_the_checkpoint() -> None:
    assert decide_batch({}, {}, {T0: 5}, batch_id=0).action == BatchAction.RUN
    behind = decide_batch({T0: 3}, {T0: 10}, {T0: 20}, batch_id=5)
    assert behind.action == BatchAction.RUN
    assert "behind" in behind.detail
