"""One partition's commit (the body of a partitioned task) on the real broker, without Spark.

A producer that committed its partition in this run does not read G again
(it knows what its own last commit left there).  These tests prove that
knowledge is never trusted where it could be wrong: after another holder of
the id committed, and in a new run after G was reset.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pytest

from devenv.kafka import KafkaBroker
from eop_spark.offsets import Offsets, TopicPartition
from eop_spark.progress import ProgressGroup
from eop_spark.reset import commit_progress
from eop_spark.sink_contract import SOURCE_OFFSET, SOURCE_PARTITION, output_layout
from eop_spark.sink_partitioned import PartitionTask, _discard, commit_partition
from eop_spark.sink_settings import SinkSettings
from eop_spark.transactions import TransactionalProducer
from tests.plugins.kafka import TopicFactory
from tests.spark_apps.harness import client_config, read_committed

LAYOUT = output_layout([("value", "binary")])


@dataclass(frozen=True)
class Partition:
    """A sink and the one source partition its tests commit for."""

    broker: KafkaBroker
    sink: SinkSettings
    tp: TopicPartition

    def commit(self, run: str, first: int, until: int) -> str:
        """Commit the batch ``[first, until)`` of the partition in ``run``; return its status."""
        task = PartitionTask(self.sink, {self.tp: until}, LAYOUT, f"q:{until}", run)
        return commit_partition(task, self.tp, self.rows(first, until)).status

    def rows(self, first: int, until: int) -> list[pa.RecordBatch]:
        """The source rows ``[first, until)`` as the transform hands them to the sink."""
        offsets = list(range(first, until))
        return [
            pa.RecordBatch.from_pydict(
                {
                    "value": [str(o).encode() for o in offsets],
                    SOURCE_PARTITION: pa.array([self.tp[1]] * len(offsets), pa.int32()),
                    SOURCE_OFFSET: pa.array(offsets, pa.int64()),
                }
            )
        ]

    def output(self) -> list[int]:
        """The source offsets whose output a read_committed reader sees, sorted."""
        return sorted(
            int(value or b"") for _, value in read_committed(self.broker, self.sink.topic)
        )

    def progress(self) -> Offsets:
        group = ProgressGroup(self.sink.group, self.sink.client_config)
        try:
            return group.committed([self.tp])
        finally:
            group.close()


@pytest.fixture
def partition(kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory) -> Iterator[Partition]:
    conf = {k: str(v) for k, v in client_config(kafka_broker).items()}
    group = f"eop.test.{uuid.uuid4().hex[:8]}"
    progress = ProgressGroup(group, conf)
    try:
        sink = SinkSettings(
            topic=kafka_topic_factory(1, prefix="out"),
            client_config=conf,
            transactional_id_prefix=group,
            transaction_timeout="60s",
            group=group,
            group_metadata=progress.group_metadata(),
        )
    finally:
        progress.close()
    tp = (kafka_topic_factory(1, prefix="in"), 0)
    yield Partition(kafka_broker, sink, tp)
    _discard(sink, tp)  # the module's producer cache outlives the test otherwise


def test_a_commit_by_another_holder_of_the_id_is_not_taken_for_granted(
    partition: Partition,
) -> None:
    assert partition.commit("run", 0, 10) == "committed"
    # Another runner takes the id over and commits [10, 20) itself.
    sink, tp = partition.sink, partition.tp
    other = TransactionalProducer(sink.producer_config(tp))
    try:
        other.begin()
        other.send_offsets({tp: 20}, sink.group_metadata, "other")
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
    commit_progress(partition.sink.group, {partition.tp: 0}, partition.sink.client_config)
    assert partition.commit("second", 0, 10) == "committed"
    assert partition.output() == sorted([*range(10), *range(10)])
    assert partition.progress() == {partition.tp: 10}
