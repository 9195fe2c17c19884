"""What every sink transaction needs to know, in one picklable value; taking the ids over."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from eop_spark.contract.offsets import TopicPartition
from eop_spark.contract.progress_names import ProgressNames
from eop_spark.contract.spec import Duration
from eop_spark.kafka.client_config import producer_config
from eop_spark.kafka.transactional_producer import ArrowPath, TransactionalProducer


@dataclass(frozen=True)
class SinkSettings:
    """The sink side of a run: topic, clients, transactional ids, the progress group.

    Shipped to Spark tasks by the partitioned sink, so it holds plain data
    only (the group metadata is bytes in confluent-kafka).
    """

    topic: str
    client_config: dict[str, str]
    transactional_id_prefix: str
    transaction_timeout: Duration
    #: The progress group and the names it keeps its offsets under.
    progress: ProgressNames
    group_metadata: Any
    #: How the producers that write records queue Arrow columns (None: ``produce()`` only).
    arrow_path: ArrowPath | None = None

    @property
    def group(self) -> str:
        """The progress group ``G``."""
        return self.progress.group

    def transactional_id(self, tp: TopicPartition | None = None) -> str:
        """``<prefix>.<topic>.<partition>`` for a source partition, ``<prefix>.driver`` without."""
        if tp is None:
            return f"{self.transactional_id_prefix}.driver"
        return f"{self.transactional_id_prefix}.{tp[0]}.{tp[1]}"

    def producer_config(self, tp: TopicPartition | None = None) -> dict[str, Any]:
        """The producer settings for :meth:`transactional_id` ``(tp)``."""
        return producer_config(
            self.client_config, self.transactional_id(tp), self.transaction_timeout.ms
        )

    def record_producer(self, conf: dict[str, Any]) -> TransactionalProducer:
        """A producer with ``conf`` (a :meth:`producer_config`) that writes records.

        It queues Arrow columns through :attr:`arrow_path` when there is one.
        Built, it has fenced every older holder of its transactional id.
        """
        return TransactionalProducer(conf, arrow_path=self.arrow_path)


def take_over(sink: SinkSettings, partitions: Iterable[TopicPartition]) -> int:
    """Initialise every transactional id of the pipeline once; return how many.

    A runner that starts fences all older holders of its ids (a crashed or
    zombie runner) and so aborts the transactions they left open.  Until
    those are aborted, stable reads of G would wait for the transaction
    timeout, and a zombie could still commit.
    """
    ids: list[TopicPartition | None] = [None, *partitions]

    def init(tp: TopicPartition | None) -> None:
        TransactionalProducer(sink.producer_config(tp)).close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(init, ids))
    return len(ids)
