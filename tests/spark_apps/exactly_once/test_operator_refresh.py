"""The operator's refresh of G racing a runner that just started, on the real broker (no Spark).

The operator refreshes G while it believes no driver runs, from a pod status
that may be stale: a runner may be committing at that very moment.  Its
refresh must then leave G where the runner put it, whichever commit mode the
runner is in: it re-commits only what G still holds at commit time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from eop_spark.contract.offsets import TopicPartition
from eop_spark.exactly_once.keep_alive import refresh_without_runner
from eop_spark.exactly_once.progress_group import Progress, ProgressGroup
from eop_spark.exactly_once.sink_settings import SinkSettings
from eop_spark.kafka.transactional_producer import TransactionalProducer
from tests.spark_apps.exactly_once.conftest import Partition

pytestmark = pytest.mark.kafka


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


def coordinated_batch(sink: SinkSettings, tp: TopicPartition, until: int) -> None:
    """A coordinated runner committing G to ``until`` under ``<prefix>.driver`` (a new epoch)."""
    producer = TransactionalProducer(sink.producer_config())
    try:
        producer.begin()
        producer.send_offsets({tp: until}, sink.group_metadata, f"q:{until}", names=sink.progress)
        producer.commit()
    finally:
        producer.close()


@pytest.mark.parametrize("mode", ["partitioned", "coordinated"])
def test_a_refresh_racing_a_runner_never_moves_g_back(partition: Partition, mode: str) -> None:
    sink, tp = partition.sink, partition.tp
    assert partition.commit("run", 0, 10) == "committed"

    def runner() -> None:
        if mode == "partitioned":  # its task takes the partition's id back
            assert partition.commit("run", 10, 20) == "committed"
        else:
            coordinated_batch(sink, tp, 20)

    group = RacedGroup(sink, runner)
    try:
        refresh_without_runner(sink, group, [tp])
    finally:
        group.close()
    assert group.runner is None  # the runner did commit in the middle of the refresh
    assert partition.progress() == {tp: 20}
    # The coordinated stand-in commits offsets only.
    assert partition.output() == list(range(20 if mode == "partitioned" else 10))
