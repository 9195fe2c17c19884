"""How many copies the topics eop's exactly-once rests on keep: the floors and their check.

Output is visible, and the progress group ``G`` counts it, once a transaction
commits; with a replication factor of 1, or ``min.insync.replicas`` 1, one
lost broker loses output (or G's progress topics) that G already counts.  So
on a cluster of two or more brokers the sink topic and the progress topics
must keep at least :func:`floors` copies: a replication factor of
``min(3, brokers)`` and ``min.insync.replicas`` of ``min(2, that)``.  A
single-broker cluster has one copy of everything and is never refused.

:func:`check_topics` runs before Spark starts: ``refuse`` (the default) fails
the runner with one line naming each topic and its numbers, ``warn`` logs the
same line and goes on.  eop creates its progress topics at the floors
(:func:`new_topic_settings`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eop_spark.contract.errors import EnvironmentNotReady
from eop_spark.contract.spec import Durability
from eop_spark.kafka.client_config import EAGER_CONNECTIONS

log = logging.getLogger(__name__)

#: Seconds the metadata and config requests may take.
TIMEOUT_S = 10.0
MIN_ISR = "min.insync.replicas"


@dataclass(frozen=True)
class Floors:
    """The fewest copies a topic may keep on a cluster."""

    replication_factor: int
    min_insync_replicas: int


def floors(brokers: int) -> Floors:
    """The floors on a cluster of ``brokers`` brokers (1 and 1 on a single broker)."""
    replication = max(1, min(3, brokers))
    return Floors(replication, min(2, replication))


def new_topic_settings(brokers: int) -> tuple[int, dict[str, str]]:
    """The replication factor and configs of a topic eop creates on a cluster of ``brokers``.

    ``-1`` (the broker's default) on a single broker, else the floors.
    """
    if brokers < 2:
        return -1, {}
    found = floors(brokers)
    return found.replication_factor, {MIN_ISR: str(found.min_insync_replicas)}


def check_topics(
    client_config: Mapping[str, Any],
    topics: Mapping[str, str],
    policy: Durability,
) -> list[str]:
    """Check ``topics`` (name -> what it is: "sink topic", ...) against the cluster's floors.

    Returns the problems found, one line each (naming the topic and its
    numbers); raises :class:`EnvironmentNotReady` with them under
    :attr:`Durability.REFUSE`, logs them under :attr:`Durability.WARN`.
    Topics the cluster does not list are left to the other checks.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({**EAGER_CONNECTIONS, **client_config, "log_level": 0})
    servers = client_config.get("bootstrap.servers")
    try:
        metadata = admin.list_topics(timeout=TIMEOUT_S)
    except KafkaException as exc:
        raise EnvironmentNotReady(
            f"cannot read the topics' replication on the sink cluster at {servers}: {exc}"
        ) from exc
    brokers = len(metadata.brokers)
    if brokers < 2:
        return []
    least = floors(brokers)
    replication = {
        name: min(len(p.replicas) for p in metadata.topics[name].partitions.values())
        for name in topics
        if name in metadata.topics and metadata.topics[name].partitions
    }
    problems = []
    for name, isr in _min_insync_replicas(admin, sorted(replication)).items():
        rf = replication[name]
        if isinstance(isr, str):
            problems.append(
                f"cannot read {MIN_ISR} of {topics[name]} {name} on {servers} ({isr}): "
                f"grant DESCRIBE_CONFIGS on topic {name}"
            )
        elif rf < least.replication_factor or isr < least.min_insync_replicas:
            problems.append(
                f"{topics[name]} {name} has replication factor {rf} and {MIN_ISR} {isr} on a "
                f"cluster of {brokers} brokers at {servers}, below the floor of "
                f"{least.replication_factor} and {least.min_insync_replicas}: a lost broker "
                "can lose output the progress group already counts"
            )
    _enforce(problems, policy)
    return problems


def _min_insync_replicas(admin: Any, topics: Sequence[str]) -> dict[str, int | str]:
    """Each topic's effective ``min.insync.replicas``, or why it could not be read."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin._config import ConfigResource
    from confluent_kafka.admin._resource import ResourceType

    if not topics:
        return {}
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in topics]
    found: dict[str, int | str] = {}
    for resource, future in admin.describe_configs(resources, request_timeout=TIMEOUT_S).items():
        try:
            entry = future.result(timeout=TIMEOUT_S).get(MIN_ISR)
        except (KafkaException, TimeoutError) as exc:
            found[resource.name] = (
                exc.args[0].str() if isinstance(exc, KafkaException) else "timeout"
            )
            continue
        found[resource.name] = int(entry.value) if entry is not None and entry.value else 1
    return found


def _enforce(problems: list[str], policy: Durability) -> None:
    if not problems:
        return
    if policy == Durability.REFUSE:
        raise EnvironmentNotReady(
            "; ".join(problems)
            + ": raise them (kafka-topics --alter / kafka-configs --alter), or set "
            "sink.kafka.durability to warn"
        )
    for problem in problems:
        log.warning("durability: %s", problem)
