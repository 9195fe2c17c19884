"""Stateless upgrades: a new checkpoint generation that reprocesses from startingOffsets.

A new generation normally starts from the progress group ``G`` (exactly-once
across incompatible changes).  A ``stateless`` upgrade is a deliberate
reprocess instead: before the query starts, ``G`` is set to the spec's
``startingOffsets``, so the query starts there and the sinks do not skip
records that ``G`` had already passed.  This runs only while the generation's
checkpoint has no batch yet: once Spark wrote ``offsets/0`` the query resumes
its checkpoint, and a restarted driver never resets twice.
"""

from __future__ import annotations

import logging

from eop_spark.contract.offsets import EARLIEST, LATEST, Offsets, TopicPartition, starting_offsets
from eop_spark.contract.progress_names import ProgressNames
from eop_spark.contract.run_config import RunConfig
from eop_spark.exactly_once.offsets_log import OffsetsLog
from eop_spark.exactly_once.progress_group import commit_offsets
from eop_spark.kafka.client_config import EAGER_CONNECTIONS, source_client_config

log = logging.getLogger(__name__)

#: Seconds to wait for watermarks and the offset commit.
TIMEOUT_S = 30.0


def resolve_markers(offsets: Offsets, config: RunConfig) -> Offsets:
    """Replace Spark's earliest/latest markers with the partitions' real offsets."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    if all(offset >= 0 for offset in offsets.values()):
        return dict(offsets)
    consumer = Consumer(
        {
            **EAGER_CONNECTIONS,
            **source_client_config(config),
            "group.id": "eop-reset",
            "log_level": 0,
        }
    )
    try:
        resolved: Offsets = {}
        for (topic, partition), offset in offsets.items():
            if offset >= 0:
                resolved[(topic, partition)] = offset
                continue
            low, high = consumer.get_watermark_offsets(
                KafkaTopicPartition(topic, partition), timeout=TIMEOUT_S
            )
            resolved[(topic, partition)] = low if offset == EARLIEST else high
            assert offset in (EARLIEST, LATEST)
        return resolved
    finally:
        consumer.close()


def reset_for_stateless_generation(
    config: RunConfig,
    offsets_log: OffsetsLog,
    partitions: list[TopicPartition],
    sink_conf: dict[str, str],
    names: ProgressNames,
) -> Offsets | None:
    """Set ``G`` to ``startingOffsets`` when this generation asks for it and has not started.

    Returns the offsets committed, or None when nothing was reset.  Call it after
    the transactional ids were taken over (no transaction may still move ``G``).
    ``names``: where ``G`` keeps its offsets (no member ever joins ``G``, so a
    plain commit is allowed).
    """
    if not config.reset_progress or not offsets_log.is_new() or not partitions:
        return None
    wanted = resolve_markers(
        starting_offsets(partitions, {}, config.source.kafka.starting_offsets), config
    )
    commit_offsets(names, wanted, sink_conf)
    log.warning(
        "stateless generation %d: progress group %s reset to startingOffsets %s; "
        "records from there are processed again",
        config.generation,
        config.progress_group,
        config.source.kafka.starting_offsets,
    )
    return wanted
