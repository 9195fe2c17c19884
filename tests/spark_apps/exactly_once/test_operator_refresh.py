"""The operator's refresh of G racing a runner that just started, on the real broker (no Spark).

The operator refreshes G while it believes no driver runs, from a pod status
that may be stale: a runner may be committing at that very moment.  Its
refresh must then leave G where the runner put it, whichever commit mode the
runner is in: it re-commits only what G still holds at commit time.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
import pytest

from devenv.kafka import KafkaBroker
from devenv.runners import client_config
from eop_spark.contract.offsets import TopicPartition
from eop_spark.contract.progress_names import ProgressNames
from eop_spark.exactly_once.keep_alive import refresh_without_runner
from eop_spark.exactly_once.partitioned.task import PartitionTask, _discard, commit_partition
from eop_spark.exactly_once.progress_group import Progress, ProgressGroup
from eop_spark.exactly_once.sink_contract import SOURCE_OFFSET, SOURCE_PARTITION, output_layout
from eop_spark.exactly_once.sink_settings import SinkSettings
from eop_spark.kafka.transactional_producer import TransactionalProducer
from tests.plugins.kafka import TopicFactory

pytestmark = pytest.mark.kafka

LAYOUT = output_layout([("value", "binary")])


class RacedGroup(ProgressGroup):
    """G's reader for the operator: a runner commits right after the operator's first read."""

    def __init__(self, sink: SinkSettings, runner: Callable[[], None]) -> None:
        super().__init__(sink.progress, sink.client_config)
        self.runner: Callable[[], None] | None = runner

    def read(self, partitions: Iterable[TopicPartition], timeout: float = 30.0) -> Progress:
        held = super().read(partitions, timeout)
        if self.runner is not None:
            self.runner, runner = None, self.runner
            runner()
        return held


@pytest.fixture
def pipeline(
    kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory
) -> Iterator[tuple[SinkSettings, TopicPartition]]:
    """A pipeline's sink settings and its one source partition."""
    conf = {k: str(v) for k, v in client_config(kafka_broker).items()}
    group = f"eop.test.{uuid.uuid4().hex[:8]}"
    progress = ProgressGroup(ProgressNames(group), conf)
    try:
        settings = SinkSettings(
            topic=kafka_topic_factory(1, prefix="out"),
            client_config=conf,
            transactional_id_prefix=group,
            transaction_timeout="60s",
            progress=progress.names,
            group_metadata=progress.group_metadata(),
        )
    finally:
        progress.close()
    tp = (kafka_topic_factory(1, prefix="in"), 0)
    yield settings, tp
    _discard(settings, tp)  # the task module's producers outlive the test otherwise


def partitioned_batch(sink: SinkSettings, tp: TopicPartition, first: int, until: int) -> None:
    """A partitioned runner's task committing ``[first, until)`` of ``tp``."""
    offsets = list(range(first, until))
    rows = pa.RecordBatch.from_pydict(
        {
            "value": [str(o).encode() for o in offsets],
            SOURCE_PARTITION: pa.array([tp[1]] * len(offsets), pa.int32()),
            SOURCE_OFFSET: pa.array(offsets, pa.int64()),
        }
    )
    task = PartitionTask(sink, {tp: until}, LAYOUT, f"q:{until}", "run")
    assert commit_partition(task, tp, [rows]).status == "committed"


def coordinated_batch(sink: SinkSettings, tp: TopicPartition, until: int) -> None:
    """A coordinated runner committing G to ``until`` under ``<prefix>.driver`` (a new epoch)."""
    producer = TransactionalProducer(sink.producer_config())
    try:
        producer.begin()
        producer.send_offsets({tp: until}, sink.group_metadata, f"q:{until}", names=sink.progress)
        producer.commit()
    finally:
        producer.close()


def held(sink: SinkSettings, tp: TopicPartition) -> int | None:
    group = ProgressGroup(sink.progress, sink.client_config)
    try:
        return group.committed([tp]).get(tp)
    finally:
        group.close()


@pytest.mark.parametrize("mode", ["partitioned", "coordinated"])
def test_a_refresh_racing_a_runner_never_moves_g_back(
    pipeline: tuple[SinkSettings, TopicPartition], mode: str
) -> None:
    sink, tp = pipeline
    partitioned_batch(sink, tp, 0, 10)

    def runner() -> None:
        if mode == "partitioned":
            partitioned_batch(sink, tp, 10, 20)
        else:
            coordinated_batch(sink, tp, 20)

    group = RacedGroup(sink, runner)
    try:
        refresh_without_runner(sink, group, [tp])
    finally:
        group.close()
    assert group.runner is None  # the runner did commit in the middle of the refresh
    assert held(sink, tp) == 20
