"""Where the progress group ``G`` keeps its offsets: the one mapping every read and commit uses.

``G`` lives on the *sink* cluster, because the output's transaction commits it
(``TxnOffsetCommit``).  A broker accepts a group offset only for a partition
its own metadata has, so:

* **source and sink on the same cluster** (equal cluster ids): ``G`` holds
  each source partition's offset under the source topic-partition itself, as
  ``kafka-consumer-groups --describe --group G`` expects;
* **different clusters**: the sink cluster may not have the source topics,
  or may have other topics of the same names (fewer partitions, deleted some
  day, which drops ``G``'s offsets for them).  ``G`` then holds the offset of
  source partition ``(T, p)`` under ``(progress topic of T, p)``: a topic on
  the sink cluster named ``<G>.progress.<T>`` (:func:`progress_topic`), with
  at least ``T``'s partitions, that never holds a record
  (:mod:`eop_spark.exactly_once.cross_cluster` creates and grows them).

The choice is made from the two clusters' ids (:func:`progress_names`), so
it is the same for every run of a pipeline; a cluster that does not tell its
id stops the runner rather than guess (a wrong guess would read an empty
``G`` and repeat output).  Pure: the operator imports it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from eop_spark.contract.errors import EnvironmentNotReady
from eop_spark.contract.offsets import TopicPartition

#: The longest topic name Kafka accepts.
MAX_TOPIC_NAME = 249
#: Between the group and the source topic in a progress topic's name.
PROGRESS_INFIX = ".progress."
#: Hex digits of the hash that ends a progress topic name too long to spell out.
DIGEST_CHARS = 16

V = TypeVar("V")


def progress_topic(group: str, topic: str) -> str:
    """The progress topic of source topic ``topic`` for ``group``: ``<group>.progress.<topic>``.

    A name longer than Kafka's :data:`MAX_TOPIC_NAME` characters keeps its
    first characters and ends with ``.`` and :data:`DIGEST_CHARS` hex digits
    of the SHA-256 of ``<group>`` NUL ``<topic>``: deterministic, and distinct
    for distinct pairs.
    """
    name = f"{group}{PROGRESS_INFIX}{topic}"
    if len(name) <= MAX_TOPIC_NAME:
        return name
    digest = hashlib.sha256(f"{group}\0{topic}".encode()).hexdigest()[:DIGEST_CHARS]
    return f"{name[: MAX_TOPIC_NAME - DIGEST_CHARS - 1]}.{digest}"


@dataclass(frozen=True)
class ProgressNames:
    """The names ``G``'s offsets are committed under (plain data: shipped to Spark tasks).

    ``progress_topics`` False: the source topic-partitions themselves (same
    cluster); True: each source topic's progress topic on the sink cluster.
    """

    group: str
    progress_topics: bool = False

    def topic(self, source_topic: str) -> str:
        """The topic ``G`` holds ``source_topic``'s offsets under."""
        return progress_topic(self.group, source_topic) if self.progress_topics else source_topic

    def partition(self, tp: TopicPartition) -> TopicPartition:
        """The topic-partition ``G`` holds source partition ``tp``'s offset under."""
        return (self.topic(tp[0]), tp[1]) if self.progress_topics else tp

    def stored(self, by_source: Mapping[TopicPartition, V]) -> dict[TopicPartition, V]:
        """``by_source`` keyed by the topic-partitions ``G`` holds them under."""
        if not self.progress_topics:
            return dict(by_source)
        return {self.partition(tp): value for tp, value in by_source.items()}

    def sources(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, TopicPartition]:
        """Stored topic-partition -> source topic-partition, for the source ``partitions``."""
        return {self.partition(tp): tp for tp in partitions}

    def topic_map(self, source_topics: Iterable[str]) -> dict[str, str] | None:
        """Source topic -> progress topic (the JVM writer's settings); None: the same names."""
        if not self.progress_topics:
            return None
        return {t: self.topic(t) for t in sorted(set(source_topics))}

    def where(self) -> str:
        """Where ``G``'s offsets are, for messages: the group and, across clusters, the topics."""
        if not self.progress_topics:
            return f"progress group {self.group}"
        return (
            f"progress group {self.group} (on the sink cluster, under progress topics "
            f"{progress_topic(self.group, '<source topic>')})"
        )


def name_clash(
    names: ProgressNames, source_topic: str, source_topics: Iterable[str], sink_topic: str
) -> str | None:
    """What else ``source_topic``'s progress topic is named like: the sink topic, a source topic.

    None when nothing: a progress topic must be a topic of its own, which
    never holds a record.
    """
    name = names.topic(source_topic)
    if name == sink_topic:
        return f"the sink topic {sink_topic}"
    if name in set(source_topics):
        return f"the source topic {name}"
    return None


def progress_names(
    group: str, source_cluster: str | None, sink_cluster: str | None
) -> ProgressNames:
    """Where ``G`` keeps its offsets, from the source's and the sink's cluster ids.

    Raises :class:`EnvironmentNotReady` when either id is unknown: guessing
    could read an empty ``G`` under the other names and repeat every record.
    """
    for role, cluster in (("source", source_cluster), ("sink", sink_cluster)):
        if not cluster:
            raise EnvironmentNotReady(
                f"the {role} Kafka cluster did not tell its cluster id: eop needs it to know "
                f"whether progress group {group} can hold the source topics' offsets"
            )
    return ProgressNames(group, progress_topics=source_cluster != sink_cluster)
