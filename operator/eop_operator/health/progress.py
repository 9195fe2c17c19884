"""Read a pipeline's progress from Kafka: G's committed offsets and the source's end offsets.

The operator uses the same client settings as the driver: the spec's
bootstrap servers and options, plus the referenced Secrets, which it reads
through the API (``get`` on that one Secret) instead of a mounted volume.
Secret values go to the Kafka clients only; an error message that would
contain one, plain or encoded (eop_spark.contract.redaction), is redacted before it
reaches the status or the log.

The source's end offsets are read from the source cluster, G from the sink
cluster, under the names the runner commits it under
(:mod:`eop_spark.contract.progress_names`: the source topics when both are one cluster,
G's progress topics when their cluster ids differ).

The confluent-kafka calls block, so they run in a worker thread, each with a
timeout: an unreachable broker costs one check interval and yields
:class:`ProgressUnavailable` with a message for the status, never a storm of
exceptions.
"""

from __future__ import annotations

import asyncio
import base64
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial

from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.health.stall import PartitionOffsets, Reading
from eop_operator.kube.client import KubeClient, KubeError, KubeUnavailable
from eop_spark.contract.errors import EopError
from eop_spark.contract.offsets import EARLIEST, LATEST, TopicPartition, starting_offsets
from eop_spark.contract.owned_settings import SINK_OPTIONS, SOURCE_OPTIONS
from eop_spark.contract.progress_names import ProgressNames
from eop_spark.contract.redaction import Redactor
from eop_spark.contract.spec import KafkaSource
from eop_spark.operator_access import (
    ask_progress_names,
    committed_offsets,
    secret_text,
    sink_librdkafka_config,
    source_librdkafka_config,
)

#: Seconds each Kafka request of a check may take.
DEFAULT_TIMEOUT_S = 10.0


class ProgressUnavailable(Exception):
    """The offsets could not be read; the message is safe to show in the status."""


@dataclass(frozen=True)
class KafkaAccess:
    """librdkafka settings for the source cluster and the sink cluster (where G lives)."""

    source: dict[str, str]
    sink: dict[str, str]
    #: Secret values, to redact from error messages.
    secrets: tuple[str, ...] = ()

    def redact(self, message: str) -> str:
        """``message`` with every Secret value, plain or encoded, replaced by ``***``."""
        return Redactor(self.secrets).redact(message)


class SecretRefused(ProgressUnavailable):
    """A Secret the pipeline names holds what eop refuses (the message names the key)."""


async def secret_data(client: KubeClient, namespace: str, name: str) -> Mapping[str, str]:
    """A Secret's ``data`` as the API server holds it (base64 values, not decoded).

    Raises :class:`ProgressUnavailable` when the Secret does not exist or cannot be
    read.  An API server that does not answer is not the Secret's fault:
    KubeUnavailable passes.
    """
    try:
        secret = await client.get("v1", "Secret", namespace, name)
    except KubeUnavailable:
        raise
    except KubeError as exc:
        raise ProgressUnavailable(f"cannot read Secret {name}: {exc}") from None
    if secret is None:
        raise ProgressUnavailable(f"Secret {name} does not exist")
    data: Mapping[str, str] = secret.get("data") or {}
    return data


async def read_secret(client: KubeClient, namespace: str, name: str) -> dict[str, str]:
    """The properties of a Secret (one per key), decoded; raises ProgressUnavailable.

    A key that is not text raises :class:`SecretRefused`; see :func:`secret_data`.
    """
    data = await secret_data(client, namespace, name)
    try:
        # The same rules as the driver's mounted Secret (unused binary keys skipped).
        return secret_text(
            f"Secret {name}", {key: partial(base64.b64decode, value) for key, value in data.items()}
        )
    except EopError as exc:
        raise SecretRefused(exc.message) from None


def owned_secret_key(pipeline: ExactlyOncePipeline, side: str, secret: Mapping[str, str]) -> None:
    """Raise :class:`SecretRefused` naming the first key of ``side``'s Secret that eop owns.

    ``side``: "source" or "sink".  The API server refuses such keys in ``options``;
    a Secret's keys only the operator (and the runner) can see.
    """
    kafka = pipeline.spec.source.kafka if side == "source" else pipeline.spec.sink.kafka
    owned = SOURCE_OPTIONS if side == "source" else SINK_OPTIONS
    ref = kafka.secret_ref
    if ref is None:
        return
    for key in secret:
        if owned.owns(key):
            where = f"spec.{side}.kafka.secretRef (Secret {ref.name})"
            raise SecretRefused(owned.refusal(key, where))


async def kafka_access(client: KubeClient, pipeline: ExactlyOncePipeline) -> KafkaAccess:
    """The Kafka client settings of ``pipeline``, Secrets read through the API.

    Raises :class:`SecretRefused` for a Secret key eop refuses, else
    :class:`ProgressUnavailable` when a Secret cannot be read.
    """
    namespace = pipeline.metadata.namespace
    source, sink = pipeline.spec.source.kafka, pipeline.spec.sink.kafka
    source_secret = (
        await read_secret(client, namespace, source.secret_ref.name) if source.secret_ref else {}
    )
    sink_secret = (
        await read_secret(client, namespace, sink.secret_ref.name) if sink.secret_ref else {}
    )
    owned_secret_key(pipeline, "source", source_secret)
    owned_secret_key(pipeline, "sink", sink_secret)
    secrets = (*source_secret.values(), *sink_secret.values())
    access = KafkaAccess({}, {}, secrets)
    try:
        return KafkaAccess(
            source=source_librdkafka_config(source, source_secret),
            sink=sink_librdkafka_config(sink, sink_secret),
            secrets=secrets,
        )
    except EopError as exc:
        raise ProgressUnavailable(access.redact(exc.message)) from None


def source_partitions(
    topics: Mapping[str, Iterable[int]], source: KafkaSource
) -> list[TopicPartition]:
    """The partitions the pipeline reads, from the cluster's topic metadata.

    ``topicPattern`` is matched against whole names as Java's ``Pattern.matches``
    does; internal topics (``__consumer_offsets``...) never match.
    """
    if source.topics is not None:
        missing = sorted(set(source.topics) - set(topics))
        if missing:
            raise ProgressUnavailable(f"source topic(s) {', '.join(missing)} do not exist")
        names = list(source.topics)
    else:
        assert source.topic_pattern is not None  # the spec's one_of guarantees it
        pattern = re.compile(source.topic_pattern)
        names = sorted(t for t in topics if not t.startswith("__") and pattern.fullmatch(t))
    return [(t, p) for t in names for p in sorted(topics[t])]


def start_positions(
    partitions: Iterable[TopicPartition],
    watermarks: Mapping[TopicPartition, tuple[int, int]],
    spec_starting: str,
) -> dict[TopicPartition, int]:
    """Where the pipeline starts each partition G has never committed, as an offset.

    ``earliest`` is the low watermark, ``latest`` the end (nothing is owed until the
    pipeline commits there), explicit JSON offsets are taken as they are.
    """
    named = starting_offsets(partitions, {}, spec_starting)
    result = {}
    for tp, offset in named.items():
        low, high = watermarks[tp]
        result[tp] = low if offset == EARLIEST else high if offset == LATEST else offset
    return result


@dataclass(frozen=True)
class SourceOffsets:
    """What the source cluster says: its cluster id, and each source partition's offsets."""

    cluster_id: str | None
    #: Per source partition: (low, last stable) offsets.
    watermarks: dict[TopicPartition, tuple[int, int]]


def read_watermarks(
    access: KafkaAccess,
    pipeline: ExactlyOncePipeline,
    group: str,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> SourceOffsets:
    """The source cluster's id, the partitions of ``pipeline`` and their offsets (blocking)."""
    from confluent_kafka import Consumer, KafkaException
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    source = pipeline.spec.source.kafka
    try:
        consumer = Consumer(
            {
                **access.source,
                "group.id": group,  # never subscribes, so it never joins G
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "log_level": 0,
            }
        )
    except KafkaException as exc:
        raise ProgressUnavailable(access.redact(f"invalid source client settings: {exc}")) from None
    try:
        metadata = consumer.list_topics(timeout=timeout)
        topics = {name: list(t.partitions) for name, t in metadata.topics.items() if not t.error}
        watermarks = {
            (t, p): consumer.get_watermark_offsets(
                KafkaTopicPartition(t, p), timeout=timeout, cached=False
            )
            for t, p in source_partitions(topics, source)
        }
        return SourceOffsets(metadata.cluster_id or None, watermarks)
    except KafkaException as exc:
        raise ProgressUnavailable(
            access.redact(f"cannot read the source at {source.bootstrap_servers}: {exc.args[0]}")
        ) from None
    finally:
        consumer.close()


def read_offsets(
    access: KafkaAccess,
    pipeline: ExactlyOncePipeline,
    group: str,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> tuple[PartitionOffsets, ...]:
    """G's committed offsets and the source's end offsets, per source partition (blocking).

    End offsets are last stable offsets (``read_committed``): input the
    pipeline can read, as ``kafka-consumer-groups`` shows when no input
    transaction is open.
    """
    source = pipeline.spec.source.kafka
    read = read_watermarks(access, pipeline, group, timeout=timeout)
    watermarks = read.watermarks
    partitions = list(watermarks)
    names = group_names(access, group, read.cluster_id, timeout=timeout)
    try:
        committed = committed_offsets(names, access.sink, partitions, timeout)
    except EopError as exc:
        raise ProgressUnavailable(access.redact(exc.message)) from None
    starts = start_positions(partitions, watermarks, source.starting_offsets)
    return tuple(
        PartitionOffsets(
            topic=t,
            partition=p,
            committed=committed.get((t, p)),
            end=watermarks[(t, p)][1],
            start=starts[(t, p)],
        )
        for t, p in partitions
    )


def group_names(
    access: KafkaAccess, group: str, source_cluster: str | None, *, timeout: float
) -> ProgressNames:
    """Where ``group`` keeps its offsets, as the runner decides it: the clusters' ids (blocking).

    ``source_cluster``: the source cluster's id (from :func:`read_watermarks`);
    the sink cluster's is asked here.
    """
    try:
        return ask_progress_names(group, source_cluster, access.sink, timeout)
    except EopError as exc:
        raise ProgressUnavailable(access.redact(exc.message)) from None
    except Exception as exc:  # a client setting confluent-kafka refuses
        raise ProgressUnavailable(access.redact(f"invalid sink client settings: {exc}")) from None


async def read_progress(
    client: KubeClient,
    pipeline: ExactlyOncePipeline,
    group: str,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Reading:
    """One reading of ``pipeline``'s progress; raises ProgressUnavailable with a reason."""
    access = await kafka_access(client, pipeline)
    partitions = await asyncio.to_thread(read_offsets, access, pipeline, group, timeout=timeout)
    return Reading(at=time.time(), partitions=partitions)
