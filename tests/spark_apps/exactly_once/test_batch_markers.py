"""Batch markers in G's commit metadata, and the coordinated sink's decision from them."""

from __future__ import annotations

from eop_spark.exactly_once.batch_markers import (
    BatchAction,
    batch_marker,
    decide_batch,
    marked_batch,
)

T0, T1, U0 = ("t", 0), ("t", 1), ("u", 0)


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
