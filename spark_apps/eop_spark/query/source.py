"""The Kafka source stream, and where a new checkpoint generation starts reading."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from eop_spark.contract.offsets import TopicPartition, starting_offsets, to_spark_json
from eop_spark.contract.run_config import RunConfig
from eop_spark.exactly_once.generation_guards import check_progress_kept, earlier_progress
from eop_spark.exactly_once.offsets_log import OffsetsLog
from eop_spark.exactly_once.progress_group import ProgressGroup
from eop_spark.kafka.client_config import spark_source_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class StartingPoint:
    """Spark's ``startingOffsets`` for this run, why, and whether it resumes G's progress."""

    offsets: str
    why: str
    #: A new generation that resumes partitions from G (state, if any, restarts empty).
    resumes_progress: bool = False


def resolve_starting_offsets(
    config: RunConfig,
    offsets_log: OffsetsLog,
    progress: ProgressGroup,
    partitions: list[TopicPartition],
) -> StartingPoint:
    """Spark's ``startingOffsets`` for this run, and a sentence saying why.

    Spark reads ``startingOffsets`` only when the checkpoint has no batch yet:
    then the run starts where G says the visible output ends, and partitions
    G has never seen start as the spec says.  A partition that an earlier
    generation committed but G no longer holds stops the run (see
    :func:`eop_spark.exactly_once.generation_guards.check_progress_kept`).
    """
    spec = config.source.kafka.starting_offsets
    if not offsets_log.is_new():
        return StartingPoint(spec, f"resuming checkpoint {config.checkpoint_location}")
    if not partitions:
        return StartingPoint(
            spec, "new checkpoint, no source partition yet: startingOffsets from the spec"
        )
    committed = progress.committed(partitions)
    earlier = earlier_progress(config.checkpoint_root, offsets_log.files, config.generation)
    forced = check_progress_kept(config, earlier, committed, partitions, progress.names)
    offsets = starting_offsets(partitions, committed, spec)
    seen = sum(1 for tp in partitions if tp in committed)
    why = (
        f"new checkpoint {config.checkpoint_location}: {seen} of {len(partitions)} partitions "
        f"resume from {progress.names.where()}, the others start at {spec}"
    )
    if forced:
        why += (
            f"; allowMissingProgress: {', '.join(f'{t}-{p}' for t, p in forced)} had progress "
            "in earlier generations that the progress group lost"
        )
    return StartingPoint(to_spark_json(offsets), why, resumes_progress=seen > 0)


def read_kafka(spark: SparkSession, config: RunConfig, starting: str) -> DataFrame:
    """The Kafka source stream (read_committed, failOnDataLoss, headers included)."""
    options = spark_source_options(config) | {"startingOffsets": starting}
    return spark.readStream.format("kafka").options(**options).load()
