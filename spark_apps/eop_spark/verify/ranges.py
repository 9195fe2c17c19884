"""The ranges ``eop verify`` compares: source offsets in, sink offsets out, one consistent cut.

By default the input range runs from each source partition's earliest offset
to where the progress group ``G`` says visible output ends, and the sink range
from each sink partition's earliest offset to its last stable offset (what a
``read_committed`` reader can see).  A pipeline's transaction moves ``G`` and
makes its output visible at once, so the cut reads ``G``, then the sink's end,
then ``G`` again, and takes it when ``G`` did not move in between: a running
pipeline is checked at a point where its input and output agree.

Nothing here writes: ``G`` is read with an offset fetch of a consumer that
never joins it, the watermarks with a consumer that never subscribes or commits.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eop_spark.contract.errors import ConfigError, EnvironmentNotReady, PipelineFailed
from eop_spark.contract.offsets import Offsets, TopicPartition, parse_spark_json
from eop_spark.contract.progress_names import progress_names
from eop_spark.contract.run_config import RunConfig
from eop_spark.exactly_once.progress_group import ProgressGroup
from eop_spark.kafka import preflight
from eop_spark.kafka.client_config import (
    EAGER_CONNECTIONS,
    sink_client_config,
    source_client_config,
)
from eop_spark.verify.report import Range

#: How many times the cut is tried while ``G`` keeps moving (a busy pipeline).
CUT_ATTEMPTS = 10
#: Seconds a watermark query may take.
WATERMARK_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RangeOptions:
    """Where the ranges start and end, as the user gave them (None: the defaults).

    Each is ``earliest``/``latest`` or Spark's offsets JSON ``{"topic": {"0": 42}}``;
    partitions a JSON leaves out keep their default.
    """

    source_from: str | None = None
    source_to: str | None = None
    sink_from: str | None = None

    def __post_init__(self) -> None:
        """Refuse a slice of the input whose output has no start in the sink."""
        if self.source_from is not None and self.sink_from is None:
            raise ConfigError(
                "--from-offsets needs --sink-from-offsets: without provenance in the output, "
                "only you know where the output of a slice of the input starts in the sink "
                "topic"
            )


@dataclass(frozen=True)
class Cut:
    """The input range, the sink range, and the sink topic's partitions."""

    source: Range
    sink: Range


def resolve_cut(config: RunConfig, options: RangeOptions) -> Cut:
    """The input and sink ranges of ``config``'s pipeline, read at one consistent point."""
    source_conf = source_client_config(config)
    sink_conf = sink_client_config(config)
    kafka = config.source.kafka
    source = preflight.cluster(source_conf, "source")
    sink = preflight.cluster(sink_conf, "sink")
    partitions = preflight.source_partitions(source, kafka.topics, kafka.topic_pattern)
    sink_topic = config.sink.kafka.topic
    if sink_topic not in sink.topics:
        raise EnvironmentNotReady(f"sink topic {sink_topic!r} does not exist on {sink.servers}")
    sink_partitions = [(sink_topic, p) for p in sink.topics[sink_topic]]
    names = progress_names(config.progress_group, source.id, sink.id)

    source_low, source_high = watermarks(source_conf, partitions)
    sink_low, _ = watermarks(sink_conf, sink_partitions)
    start = chosen("--from-offsets", options.source_from, source_low, source_low, source_high)
    sink_start = chosen("--sink-from-offsets", options.sink_from, sink_low, sink_low, {})
    progress = ProgressGroup(names, sink_conf)
    try:
        visible, sink_end = _stable_cut(progress, partitions, sink_conf, sink_partitions)
    finally:
        progress.close()
    by_g = {tp: visible.get(tp, start[tp]) for tp in partitions}
    end = chosen("--to-offsets", options.source_to, by_g, source_low, source_high)
    why = f"to {names.where()}" if options.source_to is None else f"to {options.source_to}"
    why = ("from the earliest offsets " if options.source_from is None else "from ") + why
    return Cut(
        source=Range(start, {tp: max(end[tp], start[tp]) for tp in partitions}, why),
        sink=Range(
            sink_start,
            {tp: max(sink_end[tp], sink_start[tp]) for tp in sink_partitions},
            "from the earliest offsets to the last stable offsets",
        ),
    )


def _stable_cut(
    progress: ProgressGroup,
    partitions: Sequence[TopicPartition],
    sink_conf: Mapping[str, Any],
    sink_partitions: Sequence[TopicPartition],
) -> tuple[Offsets, Offsets]:
    """G's offsets and the sink's last stable offsets, with G unchanged around the latter."""
    before = progress.committed(partitions)
    for _ in range(CUT_ATTEMPTS):
        _, sink_end = watermarks(sink_conf, sink_partitions)
        after = progress.committed(partitions)
        if after == before:
            return after, sink_end
        before = after
    raise PipelineFailed(
        f"{progress.names.where()} moved during each of {CUT_ATTEMPTS} reads of the sink's "
        "end: the pipeline commits too often for one consistent cut; verify it stopped, or "
        "give --to-offsets and --sink-from-offsets"
    )


def watermarks(
    client_config: Mapping[str, Any], partitions: Sequence[TopicPartition]
) -> tuple[Offsets, Offsets]:
    """The earliest and the last stable offset of each partition.

    A ``read_committed`` consumer's offset query answers the last stable
    offset (the end a transactional reader sees; the high watermark when no
    transaction is open).  The consumer never subscribes nor commits: its
    group id is a fresh one that no broker ever hears of.
    """
    from confluent_kafka import Consumer, KafkaException
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    consumer = Consumer(
        {
            **EAGER_CONNECTIONS,
            **client_config,
            "group.id": f"eop-verify-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "log_level": 0,
        }
    )
    low: Offsets = {}
    high: Offsets = {}
    try:
        for topic, partition in partitions:
            try:
                low[(topic, partition)], high[(topic, partition)] = consumer.get_watermark_offsets(
                    KafkaTopicPartition(topic, partition),
                    timeout=WATERMARK_TIMEOUT_S,
                    cached=False,
                )
            except KafkaException as exc:
                raise EnvironmentNotReady(
                    f"cannot read the offsets of {topic}-{partition}: {exc.args[0]}"
                ) from exc
    finally:
        consumer.close()
    return low, high


def chosen(
    option: str,
    given: str | None,
    default: Mapping[TopicPartition, int],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
) -> Offsets:
    """Offsets per partition of ``default``: as ``given`` says, else the default.

    ``given`` is ``earliest``, ``latest`` or Spark's offsets JSON (a partition
    it leaves out keeps its default; -2 is earliest, -1 latest).  A topic or
    partition outside the range, or JSON that does not parse, is refused
    naming ``option``.
    """
    if given is None:
        return dict(default)
    if given in ("earliest", "latest"):
        if given == "latest" and not latest:
            raise ConfigError(f"{option}: latest is not a start; give offsets or earliest")
        return dict(earliest if given == "earliest" else latest)
    try:
        offsets = parse_spark_json(given)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"{option}: expected earliest, latest or offsets JSON such as "
            f'{{"topic": {{"0": 42}}}} ({exc})'
        ) from None
    unknown = sorted(set(offsets) - set(default))
    if unknown:
        raise ConfigError(
            f"{option}: {', '.join(f'{t}-{p}' for t, p in unknown)} is not one of the "
            f"partitions verified ({', '.join(f'{t}-{p}' for t, p in sorted(default))})"
        )
    result = dict(default)
    for tp, offset in offsets.items():
        markers = {-2: earliest, -1: latest}
        if offset in markers and tp in markers[offset]:
            result[tp] = markers[offset][tp]
        elif offset < 0:
            raise ConfigError(f"{option}: offset {offset} of {tp[0]}-{tp[1]} is not an offset")
        else:
            result[tp] = offset
    return result


def spark_assign(partitions: Sequence[TopicPartition]) -> str:
    """Spark's ``assign`` option for ``partitions``: ``{"topic": [0, 1]}``."""
    nested: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        nested.setdefault(topic, []).append(partition)
    return json.dumps(nested, separators=(",", ":"))
