"""Fixtures of the exactly-once tests: one source partition's sink on the real broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pytest

from devenv.kafka import KafkaBroker
from devenv.runners import client_config, read_committed
from eop_spark.contract.offsets import Offsets, TopicPartition
from eop_spark.contract.progress_names import ProgressNames
from eop_spark.contract.spec import Duration
from eop_spark.exactly_once.partitioned.task import PartitionTask, _discard, commit_partition
from eop_spark.exactly_once.progress_group import ProgressGroup
from eop_spark.exactly_once.sink_contract import SOURCE_OFFSET, SOURCE_PARTITION, output_layout
from eop_spark.exactly_once.sink_settings import SinkSettings
from tests.plugins.kafka import TopicFactory

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
        return self.batch(range(first, until))

    def batch(self, offsets: Iterable[int]) -> list[pa.RecordBatch]:
        """One Arrow batch of output rows, one per source offset given (repeats allowed)."""
        offsets = list(offsets)
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
        return self.progress_and_marker()[0]

    def progress_and_marker(self) -> tuple[Offsets, str]:
        """G's offset for the partition, and the marker it was committed with."""
        group = ProgressGroup(self.sink.progress, self.sink.client_config)
        try:
            progress = group.read({self.tp})
        finally:
            group.close()
        return progress.offsets, progress.metadata.get(self.tp, "").rstrip("\0")


@pytest.fixture
def partition(kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory) -> Iterator[Partition]:
    """A fresh sink topic, progress group and source partition on the session broker."""
    conf = {k: str(v) for k, v in client_config(kafka_broker).items()}
    group = f"eop.test.{uuid.uuid4().hex[:8]}"
    progress = ProgressGroup(ProgressNames(group), conf)
    try:
        sink = SinkSettings(
            topic=kafka_topic_factory(1, prefix="out"),
            client_config=conf,
            transactional_id_prefix=group,
            transaction_timeout=Duration("60s"),
            progress=progress.names,
            group_metadata=progress.group_metadata(),
        )
    finally:
        progress.close()
    tp = (kafka_topic_factory(1, prefix="in"), 0)
    yield Partition(kafka_broker, sink, tp)
    _discard(sink, tp)  # the module's producer cache outlives the test otherwise
