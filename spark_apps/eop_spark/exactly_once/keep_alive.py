"""Keep the progress group's offsets from expiring (invariant 6).

No consumer ever joins ``G``, and Kafka expires each committed offset of a
group without members ``offsets.retention.minutes`` after its last commit
(KIP-211 changed this only for groups with members).  A partition with no new
input is never committed again by the sinks, and a suspended pipeline commits
nothing: after the retention its progress would be gone, and a new checkpoint
generation would start it at ``startingOffsets`` again.

A refresh re-commits, inside a transaction, exactly what ``G`` holds: the same
offset and the same commit metadata (the batch markers the coordinated sink's
skip decisions read), so it changes nothing a reader or a sink can see except
the commit time the broker expires offsets by.  The safety of a refresh rests
on the same rule as every sink commit (docs/exactly-once.md, "Failure modes
and their guards"): the producer is initialised (fencing every older holder
of its transactional id and aborting what it left open) BEFORE ``G`` is read,
so a commit that succeeds proves no other holder of that id moved ``G`` in
between; a newer holder fences the refresh and its commit fails harmlessly.

* :func:`refresh` -- one transaction of a given producer (the coordinated
  sink's own, under ``<prefix>.driver``);
* :func:`refresh_each_partition` -- the partitioned mode: one transaction per
  partition under that partition's own id ``<prefix>.<topic>.<partition>``,
  the only id the partitioned sink moves that partition of ``G`` with;
* :func:`refresh_without_runner` -- the operator's, for a pipeline it
  believes has no runner: every id fenced, each partition under its own id,
  committed only if ``G`` did not move since it was read;
* :func:`offsets_retention_ms` -- the broker's actual retention;
* :class:`KeepAlive` -- the runner's thread that refreshes between batches.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from eop_spark.contract.errors import ProducerFenced
from eop_spark.contract.offsets import Offsets, TopicPartition
from eop_spark.exactly_once.progress_group import ProgressGroup
from eop_spark.exactly_once.sink_settings import SinkSettings
from eop_spark.kafka.transactional_producer import TransactionalProducer

log = logging.getLogger(__name__)

#: The broker setting that expires a member-less group's committed offsets.
RETENTION_SETTING = "offsets.retention.minutes"
#: Refresh this many times per retention period (a refresh may fail or wait a while).
REFRESHES_PER_RETENTION = 4
#: The refresh interval when the broker does not tell its retention (refused, old broker):
#: short enough for any retention anyone sets, and one tiny transaction per hour costs nothing.
FALLBACK_INTERVAL_S = 3600.0
#: Seconds a DescribeConfigs request may take.
DESCRIBE_TIMEOUT_S = 10.0


def offsets_retention_ms(
    client_config: Mapping[str, Any], timeout: float = DESCRIBE_TIMEOUT_S
) -> int | None:
    """The smallest ``offsets.retention.minutes`` of the cluster's brokers, in ms (None: unknown).

    Asked with DescribeConfigs on each broker resource, one request per broker
    (librdkafka takes one broker resource per call): the group coordinator of
    ``G`` may be any broker, and it moves when a broker stops.  None when a
    broker refuses (no DescribeConfigs permission on the cluster) or does not
    answer in time.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._config import ConfigResource
    from confluent_kafka.admin._resource import ResourceType

    admin = AdminClient({**client_config, "log_level": 0})
    try:
        minutes = []
        for broker in sorted(admin.list_topics(timeout=timeout).brokers):
            resource = ConfigResource(ResourceType.BROKER, str(broker))
            for future in admin.describe_configs([resource], request_timeout=timeout).values():
                entry = future.result(timeout=timeout).get(RETENTION_SETTING)
                if entry is not None and entry.value is not None:
                    minutes.append(int(entry.value))
    except (KafkaException, ValueError, TimeoutError) as exc:
        log.warning("cannot read the brokers' %s: %s", RETENTION_SETTING, exc)
        return None
    return min(minutes) * 60_000 if minutes else None


def refresh_interval_s(retention_ms: int | None) -> float:
    """How often to refresh ``G`` for a retention (None: the broker did not say)."""
    if retention_ms is None or retention_ms <= 0:
        return FALLBACK_INTERVAL_S
    return retention_ms / 1000.0 / REFRESHES_PER_RETENTION


def _by_marker(offsets: Offsets, metadata: Mapping[TopicPartition, str]) -> dict[str, Offsets]:
    grouped: dict[str, Offsets] = {}
    for tp, offset in sorted(offsets.items()):
        grouped.setdefault(metadata.get(tp, ""), {})[tp] = offset
    return grouped


def refresh(
    producer: TransactionalProducer,
    progress: ProgressGroup,
    partitions: Iterable[TopicPartition],
    group_metadata: Any,
    *,
    recheck: ProgressGroup | None = None,
) -> Offsets:
    """Re-commit what ``G`` holds for ``partitions``, in one transaction of ``producer``.

    ``producer`` must have been initialised before this call (its
    ``init_transactions`` fences older holders of its id): the stable read of
    ``G`` comes after, and the commit succeeds only if nobody took the id
    over since.  Partitions ``G`` does not hold are left alone.  ``recheck``
    (a reader that does not wait for pending transactions): ``G`` is read
    again inside the transaction, and the transaction is aborted when another
    id moved it since the first read.  Returns the offsets re-committed.
    """
    held = progress.read(partitions)
    if not held.offsets:
        return {}
    producer.begin()
    try:
        # One call per distinct marker: send_offsets gives all its offsets one metadata.
        for marker, offsets in _by_marker(held.offsets, held.metadata).items():
            producer.send_offsets(offsets, group_metadata, marker, names=progress.names)
        if recheck is not None and recheck.read(held.offsets).offsets != held.offsets:
            log.info("%s: moved by a runner while refreshed, left to it", progress.group)
            producer.abort()
            return {}
        producer.commit()
    except BaseException:
        producer.abort()
        raise
    return held.offsets


def refresh_each_partition(
    settings: SinkSettings, progress: ProgressGroup, partitions: Iterable[TopicPartition]
) -> Offsets:
    """Re-commit each partition of ``G`` under its own transactional id (the partitioned mode)."""
    done: Offsets = {}
    for tp in sorted(set(partitions)):
        producer = TransactionalProducer(settings.producer_config(tp))
        try:
            done.update(refresh(producer, progress, [tp], settings.group_metadata))
        finally:
            producer.close()
    return done


def refresh_without_runner(
    settings: SinkSettings, progress: ProgressGroup, partitions: Iterable[TopicPartition]
) -> Offsets:
    """Fence every id of the pipeline, then re-commit each partition of ``G`` under its own id.

    For a pipeline the operator believes has no runner (from a pod status
    that may be stale): the driver id's producer is initialised first, then
    every partition id (a zombie of either mode is fenced and its open
    transaction aborted), and all are held until the end.  Each partition is
    re-committed under its own id, the one a partitioned runner moves it
    with: a runner that took the id since fences the commit (left to it).  A
    coordinated runner moves ``G`` under the driver id, which it must take
    back first; ``G`` is read again inside each transaction, which is aborted
    when ``G`` moved.  So a refresh never moves ``G`` back.
    """
    wanted = sorted(set(partitions))
    producers = [TransactionalProducer(settings.producer_config())]
    unstable = ProgressGroup(progress.names, settings.client_config, stable=False)
    done: Offsets = {}
    try:
        producers += [TransactionalProducer(settings.producer_config(tp)) for tp in wanted]
        for tp, producer in zip(wanted, producers[1:], strict=True):
            try:
                done.update(
                    refresh(producer, progress, [tp], settings.group_metadata, recheck=unstable)
                )
            except ProducerFenced:
                log.info("%s: taken by a runner while refreshed, left to it", tp)
        return done
    finally:
        for producer in producers:
            producer.close()
        unstable.close()


class KeepAlive:
    """The runner's thread: every interval, refresh ``G`` while no batch is in flight.

    ``between_batches`` is a context manager that holds new batches back
    until the block ends (see :class:`eop_spark.runtime.runner.BatchGate`); ``refresh``
    does the refresh of the current commit mode.  The retention is asked of
    the broker once, in the thread, so startup does not wait for it.
    """

    def __init__(
        self,
        client_config: Mapping[str, Any],
        between_batches: Callable[[], contextlib.AbstractContextManager[object]],
        refresh: Callable[[], Offsets],
        interval_s: float | None = None,
    ) -> None:
        """``interval_s`` overrides the one derived from the broker's retention."""
        self._client_config = dict(client_config)
        self._between_batches = between_batches
        self._refresh = refresh
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="eop-keep-alive", daemon=True)
        #: How many refreshes committed (for logs and tests).
        self.refreshes = 0

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (a refresh in progress finishes first)."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _interval(self) -> float:
        if self._interval_s is not None:
            return self._interval_s
        retention = offsets_retention_ms(self._client_config)
        interval = refresh_interval_s(retention)
        if retention is None:
            log.warning(
                "the sink cluster does not tell its %s: progress group offsets are refreshed "
                "every %.0f s",
                RETENTION_SETTING,
                interval,
            )
        else:
            log.info(
                "the sink cluster keeps idle progress for %.0f min: refreshed every %.0f s",
                retention / 60_000,
                interval,
            )
        return interval

    def _run(self) -> None:
        interval = self._interval()
        while not self._stopped.wait(interval):
            try:
                with self._between_batches():
                    if self._stopped.is_set():
                        return
                    offsets = self._refresh()
                self.refreshes += 1
                log.info("progress group offsets of %d partitions refreshed", len(offsets))
            except Exception as exc:  # the next interval tries again; batches commit anyway
                log.warning("refreshing the progress group failed: %s", exc)
