"""The Kafka source stream, and where a new checkpoint generation starts reading."""

from __future__ import annotations

from typing import TYPE_CHECKING

from eop_spark.client_config import spark_source_options
from eop_spark.config import RunConfig
from eop_spark.offsets import TopicPartition, starting_offsets, to_spark_json
from eop_spark.offsets_log import OffsetsLog
from eop_spark.progress import ProgressGroup

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def resolve_starting_offsets(
    config: RunConfig,
    offsets_log: OffsetsLog,
    progress: ProgressGroup,
    partitions: list[TopicPartition],
) -> tuple[str, str]:
    """Spark's ``startingOffsets`` for this run, and a sentence saying why.

    Spark reads ``startingOffsets`` only when the checkpoint has no batch yet:
    then the run starts where G says the visible output ends, and partitions
    G has never seen start as the spec says.
    """
    spec = config.source.kafka.starting_offsets
    if not offsets_log.is_new():
        return spec, f"resuming checkpoint {config.checkpoint_location}"
    if not partitions:
        return spec, "new checkpoint, no source partition yet: startingOffsets from the spec"
    committed = progress.committed(partitions)
    offsets = starting_offsets(partitions, committed, spec)
    seen = sum(1 for tp in partitions if tp in committed)
    return to_spark_json(offsets), (
        f"new checkpoint {config.checkpoint_location}: {seen} of {len(partitions)} partitions "
        f"resume from progress group {config.progress_group}, the others start at {spec}"
    )


def read_kafka(spark: SparkSession, config: RunConfig, starting: str) -> DataFrame:
    """The Kafka source stream (read_committed, failOnDataLoss, headers included)."""
    options = spark_source_options(config) | {"startingOffsets": starting}
    return spark.readStream.format("kafka").options(**options).load()
