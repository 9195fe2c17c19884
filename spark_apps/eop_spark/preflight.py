"""Checks before Spark starts: brokers reachable, topics present.

They run in seconds with librdkafka, so a typo in a topic name or an
unreachable broker fails the runner quickly with one clear line, instead of a
Spark query that waits forever on a topic that never appears.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from eop_spark.client_config import EAGER_CONNECTIONS
from eop_spark.errors import EnvironmentNotReady
from eop_spark.offsets import TopicPartition

#: How long a metadata request may take before the broker counts as unreachable.
METADATA_TIMEOUT_S = 10.0


def _metadata(client_config: Mapping[str, Any], role: str) -> Any:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    # librdkafka reports a refused login only to the error callback; the metadata request
    # then fails as a transport failure, which would read as an unreachable broker.
    refused: list[str] = []
    login_errors = (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED)

    def on_error(error: Any) -> None:
        if error.code() in login_errors:
            refused.append(error.str())

    conf = {**EAGER_CONNECTIONS, **client_config, "log_level": 0, "error_cb": on_error}
    admin = AdminClient(conf)
    servers = client_config["bootstrap.servers"]
    try:
        return admin.list_topics(timeout=METADATA_TIMEOUT_S)
    except KafkaException as exc:
        admin.poll(0)  # serves the error callback
        if refused:
            raise EnvironmentNotReady(
                f"the {role} Kafka cluster at {servers} refused the login: {refused[0]}"
            ) from exc
        raise EnvironmentNotReady(
            f"cannot reach the {role} Kafka cluster at {servers}: {exc.args[0].str()}"
        ) from exc


def _partitions(metadata: Any, topic: str) -> list[int] | None:
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        return None
    return sorted(found.partitions)


def source_partitions(
    client_config: Mapping[str, Any], topics: list[str] | None, pattern: str | None
) -> list[TopicPartition]:
    """The source's topic-partitions; every listed topic must exist."""
    metadata = _metadata(client_config, "source")
    servers = client_config["bootstrap.servers"]
    if topics is None:
        assert pattern is not None
        regex = re.compile(pattern)
        # Internal topics (__consumer_offsets, ...) never match, as the Spark source's pattern.
        topics = sorted(t for t in metadata.topics if not t.startswith("__") and regex.fullmatch(t))
    result: list[TopicPartition] = []
    for topic in topics:
        partitions = _partitions(metadata, topic)
        if partitions is None:
            raise EnvironmentNotReady(f"source topic {topic!r} does not exist on {servers}")
        result.extend((topic, p) for p in partitions)
    return result


def sink_partition_count(client_config: Mapping[str, Any], topic: str) -> int:
    """How many partitions the sink topic has; it must exist (the runner never creates it)."""
    metadata = _metadata(client_config, "sink")
    partitions = _partitions(metadata, topic)
    if partitions is None:
        raise EnvironmentNotReady(
            f"sink topic {topic!r} does not exist on {client_config['bootstrap.servers']}"
        )
    return len(partitions)
