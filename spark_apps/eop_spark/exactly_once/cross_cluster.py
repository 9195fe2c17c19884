"""Source and sink on different Kafka clusters: the progress topics, and the lag view.

When the two clusters' ids differ, the progress group ``G`` keeps each source
partition's offset under a progress topic of the sink cluster (see
:mod:`eop_spark.contract.progress_names` for why).  This module holds the two things
that mode needs beyond the mapping:

* :class:`ProgressTopics` -- the sink cluster's progress topics.  Before any
  output the runner creates them (``cleanup.policy=compact``; on a cluster
  of two or more brokers at the durability floors of
  :mod:`eop_spark.kafka.durability`, else the cluster's default replication)
  with at least their source topics' partitions, and before a batch commits
  it grows them for partitions or topics that appeared since (added
  partitions, a topic pattern's new topic).  Nothing ever writes a
  record to them: their partitions only let the sink cluster's group
  coordinator accept ``G``'s offsets, in the sink's own transactions.  A
  configuration where that cannot be done (credentials that may not create,
  describe or grow them; a progress topic name that is also the sink topic or
  a source topic) is refused with one line before any output.
* :class:`LagView` -- ``G``'s name on the *source* cluster, committed the end
  offsets of every completed batch (a plain commit), so that
  ``kafka-consumer-groups --bootstrap-server <source> --describe --group G``
  shows the pipeline's lag.  It is a view: it runs behind ``G`` by a moment,
  and nothing ever reads it back as progress.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from eop_spark.contract.errors import ConfigError, EnvironmentNotReady
from eop_spark.contract.offsets import Offsets, TopicPartition
from eop_spark.contract.progress_names import ProgressNames, name_clash
from eop_spark.exactly_once.progress_group import GroupCommitter
from eop_spark.kafka.client_config import EAGER_CONNECTIONS
from eop_spark.kafka.durability import new_topic_settings

log = logging.getLogger(__name__)

#: Seconds one admin request may take, and the most a new topic may take to show up.
ADMIN_TIMEOUT_S = 30.0
#: The settings of a progress topic that eop creates (it never holds a record).
TOPIC_CONFIG = {"cleanup.policy": "compact"}
#: How often the lag view commits what completed batches published (at most).
FLUSH_INTERVAL_S = 1.0


class ProgressTopics:
    """The progress topics of one pipeline on the sink cluster: created, grown, never written."""

    def __init__(
        self, names: ProgressNames, client_config: Mapping[str, Any], sink_topic: str
    ) -> None:
        """``names`` must use progress topics; ``client_config``: the sink cluster's."""
        from confluent_kafka.admin import AdminClient

        if not names.progress_topics:
            raise ValueError("ProgressTopics is only for progress names with progress topics")
        self.names = names
        self.sink_topic = sink_topic
        self._servers = str(client_config.get("bootstrap.servers"))
        self._admin = AdminClient({**EAGER_CONNECTIONS, **client_config, "log_level": 0})
        #: Source topic -> the partitions its progress topic is known to have.
        self._covered: dict[str, int] = {}
        self._lock = threading.Lock()

    def cover(self, partitions: Iterable[TopicPartition]) -> None:
        """Make sure ``G`` can hold the offsets of source ``partitions``: create or grow topics.

        Cheap once they are covered (no request); raises :class:`ConfigError`
        or :class:`EnvironmentNotReady` with one line naming the cause.
        """
        needed: dict[str, int] = {}
        for topic, partition in partitions:
            needed[topic] = max(needed.get(topic, 0), partition + 1)
        with self._lock:
            missing = {t: n for t, n in needed.items() if self._covered.get(t, 0) < n}
            if not missing:
                return
            sources = set(self._covered) | set(needed)
            for topic, count in sorted(missing.items()):
                self._check_name(topic, sources)
                self._covered[topic] = self._ensure(topic, count)

    def _check_name(self, source_topic: str, sources: set[str]) -> None:
        clash = name_clash(self.names, source_topic, sources, self.sink_topic)
        if clash is not None:
            raise ConfigError(
                f"progress topic {self.names.topic(source_topic)} (where progress group "
                f"{self.names.group} keeps source topic {source_topic}'s offsets on the sink "
                f"cluster) would be {clash}: rename the pipeline or the topic"
            )

    def _ensure(self, source_topic: str, count: int) -> int:
        """Create or grow ``source_topic``'s progress topic to ``count`` partitions; its count."""
        name = self.names.topic(source_topic)
        have = self._partitions(name)
        if have is None:
            self._create(name, source_topic, count)
        elif have < count:
            self._grow(name, source_topic, have, count)
        else:
            return have
        log.info("progress topic %s has %d partitions (source topic %s)", name, count, source_topic)
        return self._wait_for(name, count)

    def _partitions(self, name: str) -> int | None:
        """How many partitions topic ``name`` has on the sink cluster (None: it does not exist).

        Waits out transient errors (a new topic's leader not elected yet).
        """
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + ADMIN_TIMEOUT_S
        while True:
            try:
                metadata = self._admin.list_topics(topic=name, timeout=ADMIN_TIMEOUT_S)
            except KafkaException as exc:
                raise EnvironmentNotReady(
                    f"cannot describe progress topic {name} on the sink cluster at "
                    f"{self._servers}: {exc.args[0]}"
                ) from exc
            found = metadata.topics.get(name)
            error = None if found is None else found.error
            if error is None and found is not None:
                return len(found.partitions)
            if error is None or _unknown(error):
                return None
            if _refused(error):
                raise EnvironmentNotReady(
                    f"the sink credentials may not describe progress topic {name} on "
                    f"{self._servers}: {self._why()}; grant DESCRIBE on topic {name}"
                )
            if not error.retriable() or time.monotonic() > deadline:
                raise EnvironmentNotReady(
                    f"progress topic {name} on {self._servers}: {error.str()}"
                )
            time.sleep(0.1)

    def _why(self) -> str:
        return (
            f"source and sink are different Kafka clusters, so progress group "
            f"{self.names.group} keeps its offsets under progress topics there"
        )

    def _create(self, name: str, source_topic: str, count: int) -> None:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.cimpl import NewTopic

        brokers = len(self._admin.list_topics(timeout=ADMIN_TIMEOUT_S).brokers)
        replication, durable = new_topic_settings(brokers)
        topic = NewTopic(
            name,
            num_partitions=count,
            replication_factor=replication,
            config={**TOPIC_CONFIG, **durable},
        )
        future = self._admin.create_topics([topic], request_timeout=ADMIN_TIMEOUT_S)[name]
        try:
            future.result(timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:  # another runner, just now
                have = self._partitions(name) or 0
                if have < count:
                    self._grow(name, source_topic, have, count)
                return
            if _refused(error):
                raise EnvironmentNotReady(
                    f"the sink credentials may not create progress topic {name} on "
                    f"{self._servers}: {self._why()}; grant CREATE on topic {name} (or create "
                    f"it with {count} partitions and cleanup.policy=compact)"
                ) from exc
            raise EnvironmentNotReady(
                f"cannot create progress topic {name} (source topic {source_topic}) on "
                f"{self._servers}: {error.str()}"
            ) from exc

    def _grow(self, name: str, source_topic: str, have: int, count: int) -> None:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.cimpl import NewPartitions

        future = self._admin.create_partitions(
            [NewPartitions(name, count)], request_timeout=ADMIN_TIMEOUT_S
        )[name]
        try:
            future.result(timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0]
            grown = error.code() == KafkaError.INVALID_PARTITIONS
            if grown and (self._partitions(name) or 0) >= count:
                return  # grown meanwhile by another runner
            cause = (
                f"the sink credentials may not add partitions to it; grant ALTER on topic {name}"
                if _refused(error)
                else error.str()
            )
            raise EnvironmentNotReady(
                f"progress topic {name} has {have} partitions, fewer than the {count} of source "
                f"topic {source_topic}, and cannot be grown: {cause} (or add them: kafka-topics "
                f"--alter --topic {name} --partitions {count})"
            ) from exc

    def _wait_for(self, name: str, count: int) -> int:
        """Wait until the sink cluster's metadata shows ``name`` with ``count`` partitions."""
        deadline = time.monotonic() + ADMIN_TIMEOUT_S
        while True:
            have = self._partitions(name) or 0
            if have >= count:
                return have
            if time.monotonic() > deadline:
                raise EnvironmentNotReady(
                    f"progress topic {name} on {self._servers} shows {have} of its {count} "
                    f"partitions after {ADMIN_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.1)


def _unknown(error: Any) -> bool:
    """Whether ``error`` says the topic does not exist (the broker's code, or librdkafka's)."""
    from confluent_kafka import KafkaError

    return bool(error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC))


def _refused(error: Any) -> bool:
    """Whether ``error`` says the credentials lack a permission (an ACL)."""
    from confluent_kafka import KafkaError

    return bool(
        error.code()
        in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED)
    )


class LagView:
    """``G``'s name on the source cluster, committed the end offsets of each completed batch.

    Lag tools pointed at the source cluster read it; nothing reads it back as
    progress (the progress is ``G`` on the sink cluster).  :meth:`publish`
    only notes the offsets (it is called where batches complete); a thread of
    its own commits them every :data:`FLUSH_INTERVAL_S`, off the batch path.
    A failed commit is logged and tried again: the view never stops a pipeline.
    """

    def __init__(self, group: str, client_config: Mapping[str, Any]) -> None:
        """``client_config``: the source cluster's client settings."""
        self.group = group
        self._client_config = dict(client_config)
        self._committer: GroupCommitter | None = None
        self._lock = threading.Lock()
        self._pending: Offsets | None = None
        self._failed: str | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="eop-lag-view", daemon=True)

    def start(self) -> None:
        """Start committing what is published."""
        self._thread.start()

    def publish(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Note ``offsets`` for the next commit (the latest ones win)."""
        if offsets:
            with self._lock:
                self._pending = {**(self._pending or {}), **offsets}

    def _run(self) -> None:
        while not self._stopped.wait(FLUSH_INTERVAL_S):
            self.flush()

    def flush(self) -> None:
        """Commit what :meth:`publish` noted since the last commit, if anything."""
        with self._lock:
            offsets, self._pending = self._pending, None
        if not offsets:
            return
        try:
            if self._committer is None:
                self._committer = GroupCommitter(ProgressNames(self.group), self._client_config)
            self._committer.commit(offsets)
            self._failed = None
        except Exception as exc:  # a view never stops a run
            message = str(exc)
            if message != self._failed:
                log.warning(
                    "the lag view on the source cluster (group %s) was not updated: %s",
                    self.group,
                    message,
                )
            self._failed = message
            with self._lock:  # tried again next time, unless newer offsets came
                self._pending = {**offsets, **(self._pending or {})}

    def close(self) -> None:
        """Stop the thread, commit what is pending, release the client."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.flush()
        if self._committer is not None:
            self._committer.close()
            self._committer = None
