"""The progress group ``G``: read its committed offsets, name it in transactions.

``G`` is a consumer group on the *sink* cluster that no consumer joins.  Its
offsets move only inside sink transactions (``send_offsets_to_transaction``),
so they say exactly which input has visible output.  Reads ask for *stable*
offsets: the broker refuses to answer while a transaction touching the
partition is pending, and we wait for it to settle instead of reading a value
that may still be rolled back.

Callers speak of source topic-partitions; ``G`` holds them under the names of
its :class:`~eop_spark.contract.progress_names.ProgressNames` (the source's own, or
progress topics when source and sink are different clusters), and every read
here and every commit (:meth:`TransactionalProducer.send_offsets
<eop_spark.kafka.transactional_producer.TransactionalProducer.send_offsets>`,
:func:`commit_offsets`) goes through that mapping.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eop_spark.contract.errors import BrokerUnavailable, PipelineFailed
from eop_spark.contract.offsets import Offsets, TopicPartition
from eop_spark.contract.progress_names import ProgressNames
from eop_spark.kafka.client_config import EAGER_CONNECTIONS

#: How long a read waits for pending transactions to settle before giving up.
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Progress:
    """G's committed offsets and, per partition, the metadata committed with them."""

    offsets: Offsets
    metadata: dict[TopicPartition, str]


def consumer_config(
    group: str, client_config: Mapping[str, Any], *, stable: bool = True
) -> dict[str, Any]:
    """The settings of the idle consumer that reads ``G`` (the sink client settings under it).

    It connects eagerly (:data:`EAGER_CONNECTIONS`) unless the sink options
    say otherwise: a runner reads G on its way to its first batch.
    ``stable`` False: it reads the offsets committed so far without waiting
    for pending transactions (its own included).
    """
    return {
        **EAGER_CONNECTIONS,
        **client_config,
        "group.id": group,
        "enable.auto.commit": False,
        "isolation.level": "read_committed" if stable else "read_uncommitted",
        "log_level": 0,
    }


class ProgressGroup:
    """Reads the committed offsets of ``G`` (one idle consumer client per instance).

    A consumer that never subscribes, with ``isolation.level=read_committed``,
    asks for stable offsets (librdkafka sets ``require_stable`` then) and
    waits out pending transactions.  (AdminClient's
    ``list_consumer_group_offsets`` would do too, but librdkafka 2.16 crashes
    in it while a fresh cluster's group coordinator is not available yet.)
    """

    def __init__(
        self, names: ProgressNames, client_config: Mapping[str, Any], *, stable: bool = True
    ) -> None:
        """``names``: where ``G`` keeps its offsets; ``client_config``: the sink cluster's.

        ``stable`` False: reads do not wait for pending transactions (see
        :func:`consumer_config`); only for a check from inside a transaction.
        """
        from confluent_kafka import Consumer

        self.names = names
        self.group = names.group
        self._consumer = Consumer(consumer_config(names.group, client_config, stable=stable))

    def committed(
        self, partitions: Iterable[TopicPartition], timeout: float = DEFAULT_TIMEOUT_S
    ) -> Offsets:
        """Stable committed offsets of ``G`` for ``partitions`` (absent: never committed)."""
        return self.read(partitions, timeout).offsets

    def read(
        self, partitions: Iterable[TopicPartition], timeout: float = DEFAULT_TIMEOUT_S
    ) -> Progress:
        """Stable committed offsets and their commit metadata (the batch markers).

        ``partitions`` and the result are source topic-partitions, whatever
        names ``G`` holds them under.  Retriable errors (the coordinator
        loading or moving) are retried until ``timeout``.
        """
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        sources = self.names.sources(set(partitions))
        wanted = sorted(sources)
        if not wanted:
            return Progress({}, {})
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            remaining = max(1.0, deadline - time.monotonic())
            error: Any = None
            try:
                result = self._consumer.committed(
                    [KafkaTopicPartition(t, p) for t, p in wanted], timeout=remaining
                )
                errors = [tp.error for tp in result if tp.error is not None]
                if not errors:
                    found = [(sources[(tp.topic, tp.partition)], tp) for tp in result]
                    return Progress(
                        {source: tp.offset for source, tp in found if tp.offset >= 0},
                        {source: tp.metadata or "" for source, tp in found if tp.offset >= 0},
                    )
                error = errors[0]
            except KafkaException as exc:
                error = exc.args[0]
            if not retriable(error):
                raise PipelineFailed(f"cannot read progress group {self.group!r}: {error}")
            if time.monotonic() + delay > deadline:
                # The coordinator is away for longer (a broker restarting): a batch may be
                # tried again.
                raise BrokerUnavailable(
                    f"cannot read progress group {self.group!r} within {timeout:.0f}s: {error}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def group_metadata(self) -> Any:
        """The consumer-group metadata ``send_offsets_to_transaction`` needs to commit to ``G``.

        No consumer ever joins ``G``, so the metadata of one that never
        subscribes (generation -1, no member id) is the right one; it is
        plain bytes, safe to ship to Spark tasks.
        """
        return self._consumer.consumer_group_metadata()

    def close(self) -> None:
        """Release the client."""
        self._consumer.close()


class GroupCommitter:
    """Plain (non-transactional) commits to a group that no member joins, so they are allowed.

    For a stateless reset of ``G`` (:func:`commit_offsets`), and for the lag
    view of a cross-cluster pipeline: ``G``'s name on the source cluster
    (:class:`eop_spark.exactly_once.cross_cluster.LagView`).  One client per instance.
    """

    def __init__(self, names: ProgressNames, client_config: Mapping[str, Any]) -> None:
        """``names``: the group and its offsets' names; ``client_config``: its cluster's."""
        from confluent_kafka import Consumer

        self.names = names
        self._consumer = Consumer(
            {
                **EAGER_CONNECTIONS,
                **client_config,
                "group.id": names.group,
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit ``offsets`` of source partitions; raises :class:`PipelineFailed`."""
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        stored = self.names.stored(offsets)
        try:
            self._consumer.commit(
                offsets=[KafkaTopicPartition(t, p, o) for (t, p), o in sorted(stored.items())],
                asynchronous=False,
            )
        except KafkaException as exc:
            raise PipelineFailed(f"cannot commit to group {self.names.group}: {exc}") from exc

    def close(self) -> None:
        """Release the client."""
        self._consumer.close()


def commit_offsets(
    names: ProgressNames, offsets: Mapping[TopicPartition, int], client_config: Mapping[str, Any]
) -> None:
    """Commit ``offsets`` (of source partitions) to ``names.group``, once (see GroupCommitter)."""
    committer = GroupCommitter(names, client_config)
    try:
        committer.commit(offsets)
    finally:
        committer.close()


def retriable(error: Any) -> bool:
    """Whether a group-offset call's error passes once the group coordinator settles."""
    from confluent_kafka import KafkaError

    if not isinstance(error, KafkaError):
        return False
    return error.retriable() or error.code() in {
        KafkaError.UNSTABLE_OFFSET_COMMIT,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
    }
