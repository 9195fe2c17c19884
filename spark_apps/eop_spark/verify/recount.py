"""The recount: the pipeline's transform as a Spark batch job, compared with the sink.

:func:`verify` reads the input range with Spark's Kafka *batch* reader
(``startingOffsets``/``endingOffsets``, ``read_committed``, as the pipeline's
source reads), applies the pipeline's own transform to it, and reads the sink
range with the same reader.  Both sides are grouped by (key, value) in Spark
and joined; only the groups whose counts differ reach the driver, where
:class:`~eop_spark.verify.report.Tally` counts them.  So a clean check of any
size moves no record to the driver.

Spark's Kafka reader assigns partitions and never commits offsets: nothing is
written to the pipeline's topics or groups.  Keys and values are compared as
bytes (a string column as its UTF-8 bytes); headers and the target partition
are not compared.

A stateful query is recounted by Spark's streaming engine instead
(:func:`streamed_recount`): the same transform over the same input range, run
to its end with ``trigger.availableNow`` in the pipeline's output mode.  In
output mode ``append`` (a window closed by a watermark) it emits each window
the watermark closed once, as the pipeline must have, and both sides are
compared record by record as above.  In output modes ``update`` and
``complete`` a key's records are successive values of one row, read as a
compacted topic is: the last record per key is the table.  The recount keeps
the row each key had in the last micro-batch that emitted it
(:func:`final_expected`), the sink the record of each key at the highest
offset (:func:`final_found`), and the two tables are compared by (key, value).
The values a key had before its last are not checked.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

from eop_spark.contract.errors import ConfigError, EopError, from_failure
from eop_spark.contract.offsets import to_spark_json
from eop_spark.contract.run_config import SCRATCH_ENV, RunConfig
from eop_spark.contract.spec import OutputMode
from eop_spark.exactly_once.sink_contract import SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TOPIC
from eop_spark.kafka.client_config import (
    java_client_properties,
    sink_java_config,
    spark_source_options,
)
from eop_spark.query.state_guards import stateful_operators
from eop_spark.query.transform import Transformed, apply_transform
from eop_spark.runtime.jars import connector_jars
from eop_spark.runtime.session import build_session
from eop_spark.verify.ranges import Cut, RangeOptions, resolve_cut, spark_assign
from eop_spark.verify.report import EXAMPLES, Group, Range, Report, Tally, shown

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row, SparkSession

#: The column of :func:`streamed_recount`'s output: the micro-batch that emitted the row.
BATCH_ID = "__eop_verify_batch"
#: Options of Spark's source that choose partitions or batch sizes: the verify sets its own.
_STREAM_ONLY = ("subscribe", "subscribePattern", "assign", "maxOffsetsPerTrigger")
#: Consumer settings Spark's Kafka reader refuses (it sets them itself).
_SPARK_SETS = (
    "auto.offset.reset",
    "enable.auto.commit",
    "key.deserializer",
    "value.deserializer",
    "interceptor.classes",
)


def verify(
    config: RunConfig, options: RangeOptions | None = None, *, spark: SparkSession | None = None
) -> Report:
    """Recompute ``config``'s output over its committed input and compare it with the sink.

    ``spark``: a session to use (one is started from ``config.spark`` otherwise).
    Raises :class:`~eop_spark.contract.errors.EopError` when the check cannot run.
    """
    started = time.monotonic()
    cut = resolve_cut(config, options or RangeOptions())
    if spark is None:
        # Never empty the scratch directory of a driver this may run next to (the session
        # empties $EOP_SCRATCH_DIR, which belongs to the driver process of its pod).
        os.environ.pop(SCRATCH_ENV, None)
        spark = build_session(config, connector_jars())
    source = read_range(spark, source_options(config), cut.source).persist()
    try:
        transformed = apply_transform(spark, source, config.transform)
        analyzed = transformed.df._jdf.queryExecution().analyzed().toString()
        stateful = stateful_operators(str(analyzed))
        mode = config.transform.output_mode
        if stateful and mode != OutputMode.APPEND and not transformed.layout.has_key:
            raise ConfigError(
                f"transform: eop verify reads output mode {mode.value} as the last value per "
                "key, and the query's output has no key column: give it one that names the "
                "row (for an aggregate, its grouping columns)"
            )
        with contextlib.ExitStack() as stack:
            if not stateful:
                how = "record-wise: every output record of the input range"
                expected, found = expected_groups(transformed), found_groups(spark, config, cut)
            elif mode == OutputMode.APPEND:
                how = (
                    f"stateful ({', '.join(stateful)}, output mode append): the windows the "
                    "watermark closed by the end of the input range"
                )
                recount = stack.enter_context(streamed_recount(spark, config, cut))
                expected, found = expected_groups(recount), found_groups(spark, config, cut)
            else:
                how = (
                    f"stateful ({', '.join(stateful)}, output mode {mode.value}): "
                    "the last value per key"
                )
                recount = stack.enter_context(streamed_recount(spark, config, cut))
                expected, found = final_expected(recount), final_found(spark, config, cut)
            joined = compare(expected, found).persist()
            try:
                records_in = source.count()
                totals = joined.groupBy().sum("expected", "found").first()
                differing = joined.where("expected <> found").toLocalIterator()
                tally = Tally.of(_group(row) for row in differing)
            finally:
                joined.unpersist()
    finally:
        source.unpersist()
    return Report(
        pipeline=config.pipeline,
        source=cut.source,
        sink_topic=config.sink.kafka.topic,
        sink=cut.sink,
        records_in=records_in,
        expected_out=int((totals[0] if totals else 0) or 0),
        found=int((totals[1] if totals else 0) or 0),
        tally=tally,
        recount=how,
        elapsed_s=time.monotonic() - started,
    )


def run_verify(
    config: RunConfig,
    options: RangeOptions | None = None,
    *,
    spark: SparkSession | None = None,
    out: TextIO | None = None,
) -> int:
    """``eop verify``: print the report on ``out`` (stdout); the exit code.

    0 when the sink holds exactly the recomputed output, 7 when it does not
    (:data:`~eop_spark.contract.errors.EXIT_DISCREPANCIES`), the runner's
    codes when the check cannot run (one ``eop: error:`` line on stderr).
    """
    try:
        try:
            report = verify(config, options, spark=spark)
        except EopError:
            raise
        except Exception as exc:  # a Spark job failed: its first useful line
            raise from_failure(exc) from exc
    except EopError as error:
        print(f"eop: error: {error.message}", file=sys.stderr, flush=True)
        return error.exit_code
    print(report.render(), file=out or sys.stdout, flush=True)
    return report.exit_code


def source_options(config: RunConfig) -> dict[str, str]:
    """Spark's Kafka reader of the source, as the pipeline reads it, without its stream options."""
    options = spark_source_options(config)
    return {k: v for k, v in options.items() if k not in _STREAM_ONLY}


def sink_options(config: RunConfig) -> dict[str, str]:
    """Spark's Kafka reader of the sink topic: the sink's client settings, ``read_committed``."""
    properties = java_client_properties(sink_java_config(config))
    options = {f"kafka.{k}": v for k, v in properties.items() if k not in _SPARK_SETS}
    return options | {
        "kafka.isolation.level": "read_committed",
        "failOnDataLoss": "true",
        "includeHeaders": "false",
    }


def read_range(spark: SparkSession, options: dict[str, str], where: Range) -> DataFrame:
    """The records of ``where`` (offsets ``[start, end)`` per partition) as a batch DataFrame."""
    partitions = sorted(where.end)
    return (
        spark.read.format("kafka")
        .options(**options)
        .option("assign", spark_assign(partitions))
        .option("startingOffsets", to_spark_json({tp: where.start[tp] for tp in partitions}))
        .option("endingOffsets", to_spark_json(where.end))
        .load()
    )


@contextlib.contextmanager
def streamed_recount(spark: SparkSession, config: RunConfig, cut: Cut) -> Iterator[Transformed]:
    """The output of a stateful query over the input range, as Spark's streaming engine emits it.

    The source is read as a stream from the range's start and every record at
    or past its end is dropped before the transform, which then runs to the
    end of its input (``trigger.availableNow``) in the pipeline's output mode:
    in append it emits each window the watermark closed, once; in update the
    rows each micro-batch changed; in complete the whole table each time.
    Yields that output, each row with the micro-batch that emitted it in
    :data:`BATCH_ID`, as the runner's :class:`Transformed` (no provenance).
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField, StructType

    partitions = sorted(cut.source.end)
    stream = (
        spark.readStream.format("kafka")
        .options(**source_options(config))
        .option("assign", spark_assign(partitions))
        .option("startingOffsets", to_spark_json({tp: cut.source.start[tp] for tp in partitions}))
        .load()
    )
    in_range = [
        (F.col("topic") == topic) & (F.col("partition") == partition) & (F.col("offset") < end)
        for (topic, partition), end in sorted(cut.source.end.items())
    ]
    bounded = stream.where(functools.reduce(lambda a, b: a | b, in_range, F.lit(False)))
    transformed = apply_transform(spark, bounded, config.transform)
    batches: list[DataFrame] = []

    def keep(batch: DataFrame, batch_id: int) -> None:
        # Materialised now: the batch's rows outlive the query that computed them.
        batches.append(batch.withColumn(BATCH_ID, F.lit(batch_id)).localCheckpoint(eager=True))

    checkpoint = tempfile.mkdtemp(prefix="eop-verify-")
    try:
        query = (
            transformed.df.writeStream.foreachBatch(keep)
            .outputMode(config.transform.output_mode.value)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()  # raises the query's failure
        schema = StructType([*transformed.df.schema.fields, StructField(BATCH_ID, LongType())])
        output = functools.reduce(DataFrame.unionByName, batches, spark.createDataFrame([], schema))
        yield Transformed(output, transformed.layout, False, "")
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)


#: Where a record is: topic, partition, offset (sorted as such, offsets as numbers).
_COORDINATES = "struct<topic:string,partition:int,offset:bigint>"


def _coordinates(topic: Column, partition: Column, offset: Column) -> Column:
    from pyspark.sql import functions as F

    return F.struct(topic.alias("topic"), partition.alias("partition"), offset.alias("offset"))


def _grouped(df: DataFrame, at: Column) -> DataFrame:
    """(key, value, n, at): how many records of each (key, value), and where the first are."""
    from pyspark.sql import functions as F

    first = F.slice(F.array_sort(F.collect_list(at)), 1, EXAMPLES)
    return df.groupBy("key", "value").agg(F.count(F.lit(1)).alias("n"), first.alias("at"))


def expected_groups(transformed: Transformed) -> DataFrame:
    """The recomputed output by (key, value), with the input coordinates when kept."""
    from pyspark.sql import functions as F

    df = transformed.df
    key = F.col("key").cast("binary") if transformed.layout.has_key else F.lit(None)
    at = (
        _coordinates(F.col(SOURCE_TOPIC), F.col(SOURCE_PARTITION), F.col(SOURCE_OFFSET))
        if transformed.provenance
        else F.lit(None).cast(_COORDINATES)
    )
    output = df.select(
        key.cast("binary").alias("key"),
        F.col("value").cast("binary").alias("value"),
        at.alias("at"),
    )
    return _grouped(output, F.col("at"))


def found_groups(spark: SparkSession, config: RunConfig, cut: Cut) -> DataFrame:
    """What a ``read_committed`` reader finds in the sink range, by (key, value)."""
    from pyspark.sql import functions as F

    sink = read_range(spark, sink_options(config), cut.sink)
    return _grouped(sink, _coordinates(F.col("topic"), F.col("partition"), F.col("offset")))


def final_expected(recount: Transformed) -> DataFrame:
    """Output modes update and complete: each key's row of the last micro-batch that emitted it.

    As (key, value, n, at) with ``n`` 1, for :func:`compare`.  Raises
    :class:`~eop_spark.contract.errors.ConfigError` when that batch gave a key
    two values: its last record in the sink would depend on the order of a batch.
    """
    from pyspark.sql import functions as F

    rows = recount.df.select(
        F.col("key").cast("binary").alias("key"),
        F.col("value").cast("binary").alias("value"),
        F.col(BATCH_ID),
    )
    per_batch = rows.groupBy("key", BATCH_ID).agg(F.collect_set("value").alias("values"))
    final = per_batch.groupBy("key").agg(F.max_by("values", BATCH_ID).alias("values"))
    ambiguous = final.where(F.size("values") > 1).first()
    if ambiguous is not None:
        raise ConfigError(
            "transform: eop verify reads output mode update or complete as the last value per "
            f"key, and key {shown(_bytes(ambiguous['key']))} has "
            f"{len(ambiguous['values'])} values in one micro-batch: the key must name the row "
            "(for an aggregate, its grouping columns)"
        )
    return final.select(
        "key",
        F.col("values")[0].alias("value"),
        F.lit(1).cast("long").alias("n"),
        F.lit(None).cast(f"array<{_COORDINATES}>").alias("at"),
    )


def final_found(spark: SparkSession, config: RunConfig, cut: Cut) -> DataFrame:
    """The sink's table in output modes update and complete: each key's record at the highest
    offset (a key's records are in one partition), as (key, value, n, at) for :func:`compare`."""
    from pyspark.sql import functions as F

    sink = read_range(spark, sink_options(config), cut.sink)
    at = _coordinates(F.col("topic"), F.col("partition"), F.col("offset"))
    last = F.max_by(F.struct(F.col("value"), at.alias("at")), F.struct("offset", "partition"))
    return (
        sink.groupBy("key")
        .agg(last.alias("last"))
        .select(
            "key",
            F.col("last.value").alias("value"),
            F.lit(1).cast("long").alias("n"),
            F.array(F.col("last.at")).alias("at"),
        )
    )


def compare(expected: DataFrame, found: DataFrame) -> DataFrame:
    """(key, value, expected, found, expected_at, found_at) for every (key, value) of either.

    Keys and values match null-safely (a record without a key is a record too).
    """
    from pyspark.sql import functions as F

    e, f = expected.alias("e"), found.alias("f")
    same = F.col("e.key").eqNullSafe(F.col("f.key")) & F.col("e.value").eqNullSafe(F.col("f.value"))
    return e.join(f, same, "full_outer").select(
        F.when(F.col("e.n").isNotNull(), F.col("e.key")).otherwise(F.col("f.key")).alias("key"),
        F.when(F.col("e.n").isNotNull(), F.col("e.value"))
        .otherwise(F.col("f.value"))
        .alias("value"),
        F.coalesce(F.col("e.n"), F.lit(0)).alias("expected"),
        F.coalesce(F.col("f.n"), F.lit(0)).alias("found"),
        F.col("e.at").alias("expected_at"),
        F.col("f.at").alias("found_at"),
    )


def _bytes(value: bytes | bytearray | None) -> bytes | None:
    return None if value is None else bytes(value)


def _group(row: Row) -> Group:
    return Group(
        key=_bytes(row["key"]),
        value=_bytes(row["value"]),
        expected=int(row["expected"]),
        found=int(row["found"]),
        expected_at=tuple(f"{t}-{p}@{o}" for t, p, o in row["expected_at"] or ()),
        found_at=tuple(f"{t}-{p}@{o}" for t, p, o in row["found_at"] or ()),
    )
