"""One partition's commit (the body of a partitioned task) on the real broker, without Spark.

A producer that committed its partition in this run does not read G again
(it knows what its own last commit left there).  These tests prove that
knowledge is never trusted where it could be wrong: after another holder of
the id committed, and in a new run after G was reset.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest

from eop_spark.contract.errors import PipelineFailed
from eop_spark.contract.spec import Duration
from eop_spark.exactly_once.partitioned.task import PartitionTask, commit_partition
from eop_spark.exactly_once.progress_group import commit_offsets
from eop_spark.kafka.transactional_producer import TransactionalProducer
from tests.spark_apps.exactly_once.conftest import LAYOUT, Partition


def test_a_commit_by_another_holder_of_the_id_is_not_taken_for_granted(
    partition: Partition,
) -> None:
    assert partition.commit("run", 0, 10) == "committed"
    # Another runner takes the id over and commits [10, 20) itself.
    sink, tp = partition.sink, partition.tp
    other = TransactionalProducer(sink.producer_config(tp))
    try:
        other.begin()
        other.send_offsets({tp: 20}, sink.group_metadata, "other", names=sink.progress)
        for offset in range(10, 20):
            other.produce_one(sink.topic, str(offset).encode(), None)
        other.commit()
    finally:
        other.close()
    # This runner's producer last left G at 10; the batch [10, 30) must not repeat [10, 20).
    assert partition.commit("run", 10, 30) == "committed"
    assert partition.output() == list(range(30))
    assert partition.progress() == {tp: 30}


def test_a_replay_in_the_same_run_is_skipped(partition: Partition) -> None:
    assert partition.commit("run", 0, 10) == "committed"
    assert partition.commit("run", 0, 10) == "skipped"
    assert partition.commit("run", 10, 20) == "committed"
    assert partition.output() == list(range(20))
    assert partition.progress() == {partition.tp: 20}


def test_a_new_run_reads_g_after_a_reset(partition: Partition) -> None:
    """A stateless restart in the same process resets G: the new run reprocesses, as asked."""
    assert partition.commit("first", 0, 10) == "committed"
    commit_offsets(partition.sink.progress, {partition.tp: 0}, partition.sink.client_config)
    assert partition.commit("second", 0, 10) == "committed"
    assert partition.output() == sorted([*range(10), *range(10)])
    assert partition.progress() == {partition.tp: 10}


#: Between two Arrow batches of a task: more than a third of the 1 s transaction timeout.
PAUSE_S = 0.4


def slow_task(
    partition: Partition, *batches: list[int], fail: bool = True
) -> Iterator[pa.RecordBatch]:
    """A task's Arrow batches (source offsets each), :data:`PAUSE_S` apart; then it dies."""
    for number, offsets in enumerate(batches):
        if number:
            time.sleep(PAUSE_S)
        yield from partition.batch(offsets)
    if fail:
        raise RuntimeError("the task's executor died")


def short_timeout(partition: Partition) -> PartitionTask:
    """A task of the batch ``[0, 30)`` with a transaction timeout of 1 s."""
    sink = dataclasses.replace(partition.sink, transaction_timeout=Duration("1s"))
    return PartitionTask(sink, {partition.tp: 30}, LAYOUT, "q:30", "run")


def test_a_long_range_is_committed_in_parts_and_a_replay_repeats_none(
    partition: Partition,
) -> None:
    task, tp = short_timeout(partition), partition.tp
    dying = slow_task(partition, list(range(10)), list(range(10, 20)), list(range(20, 30)))
    with pytest.raises(RuntimeError, match="executor died"):
        commit_partition(task, tp, dying)
    # Each batch after a pause committed what came before it; the last one was aborted.
    assert partition.output() == list(range(20))
    # never taken for the batch
    assert partition.progress_and_marker() == ({tp: 20}, "q:30:partial")
    assert commit_partition(task, tp, partition.rows(0, 30)).status == "committed"
    assert partition.output() == list(range(30))
    assert partition.progress() == {tp: 30}


def test_the_rows_of_one_source_record_are_never_split_by_a_commit(
    partition: Partition,
) -> None:
    """Record 9 has two output rows, one at the end of a batch and one at the next's start."""
    task, tp = short_timeout(partition), partition.tp
    with pytest.raises(RuntimeError):
        commit_partition(task, tp, slow_task(partition, list(range(10)), [9, 10, 11]))
    commit_partition(task, tp, partition.batch([*range(10), 9, *range(10, 30)]))
    assert partition.output() == sorted([*range(30), 9])


def test_a_row_below_an_intermediate_commit_fails_the_task(partition: Partition) -> None:
    task, tp = short_timeout(partition), partition.tp
    with pytest.raises(PipelineFailed, match="in source offset order"):
        rows = slow_task(partition, list(range(10)), list(range(10, 20)), [5], fail=False)
        commit_partition(task, tp, rows)
    assert partition.progress() == {tp: 10}


def test_an_input_that_ends_early_moves_g_only_over_its_rows(partition: Partition) -> None:
    """The rows of ``[0, 30)`` stop at 19 (filtered out, or cut by an upstream failure).

    G stops after row 19, under a partial marker; the driver's offsets-only
    commit after the job brings it to the batch end.
    """
    tp = partition.tp
    task = PartitionTask(partition.sink, {tp: 30}, LAYOUT, "q:30", "run")
    outcome = commit_partition(task, tp, partition.rows(0, 20))
    assert (outcome.status, outcome.short) == ("committed", True)
    assert partition.progress_and_marker() == ({tp: 20}, "q:30:partial")
    assert commit_partition(task, tp, ()).short is False  # the driver's top-up
    assert partition.progress() == {tp: 30}
    assert partition.output() == list(range(20))
