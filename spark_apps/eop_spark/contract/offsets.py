"""Offset arithmetic on Kafka topic-partitions: pure functions, no I/O.

``Offsets`` maps ``(topic, partition)`` to an offset.  Spark writes offsets as
JSON ``{"topic": {"0": 42}}`` (in ``offsets/N`` and ``startingOffsets``, where
-2 means earliest and -1 latest); the progress group ``G`` holds "the next
offset whose output is not visible yet" per partition.  The batch markers G's
offsets carry, and what the sinks decide from them, are the exactly-once core's
(:mod:`eop_spark.exactly_once.batch_markers`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]

#: Spark's markers in ``startingOffsets`` JSON.
EARLIEST = -2
LATEST = -1


def parse_spark_json(text: str) -> Offsets:
    """Parse Spark's ``{"topic": {"partition": offset}}`` JSON into :data:`Offsets`."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError(f"offsets JSON must be an object, got {type(raw).__name__}")
    offsets: Offsets = {}
    for topic, partitions in raw.items():
        if not isinstance(partitions, dict):
            raise ValueError(f"offsets of topic {topic!r} must be an object")
        for partition, offset in partitions.items():
            offsets[(str(topic), int(partition))] = int(offset)
    return offsets


def to_spark_json(offsets: Mapping[TopicPartition, int]) -> str:
    """Render offsets as Spark's JSON, sorted for stable logs and checkpoints."""
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = offset
    return json.dumps(nested, separators=(",", ":"))


def covers(committed: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]) -> bool:
    """Whether ``committed`` (G) already holds every partition of ``end`` (a batch is visible)."""
    return all(committed.get(tp, -1) >= offset for tp, offset in end.items())


def lagging(committed: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]) -> Offsets:
    """The partitions of ``end`` that ``committed`` has not reached yet, with their end offsets."""
    return {tp: offset for tp, offset in end.items() if committed.get(tp, -1) < offset}


def starting_offsets(
    partitions: Iterable[TopicPartition],
    committed: Mapping[TopicPartition, int],
    spec_starting: str,
) -> Offsets:
    """Where a new checkpoint generation starts, per partition.

    Partitions that G has seen resume at G's committed offset (so nothing is
    lost or repeated even when the Spark checkpoint is gone); the others start
    as ``spec.source.startingOffsets`` says (``earliest``, ``latest`` or
    Spark's per-partition JSON; partitions missing from that JSON start at the
    earliest offset).  The result is complete, as Spark requires of JSON
    starting offsets.
    """
    if spec_starting == "earliest":
        default, explicit = EARLIEST, dict[TopicPartition, int]()
    elif spec_starting == "latest":
        default, explicit = LATEST, dict[TopicPartition, int]()
    else:
        default, explicit = EARLIEST, parse_spark_json(spec_starting)
    result: Offsets = {}
    for tp in partitions:
        seen = committed.get(tp)
        result[tp] = seen if seen is not None and seen >= 0 else explicit.get(tp, default)
    return result
