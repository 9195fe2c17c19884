"""Turn the source stream into the output stream: the spec's SQL or Python callable.

The input is the view ``source`` with Spark's Kafka source columns key,
value, topic, partition, offset, timestamp, headers.  A Python callable
``module.function(DataFrame) -> DataFrame`` gets the same columns plus the
provenance columns ``__eop_src_topic``, ``__eop_src_partition`` and
``__eop_src_offset``; keeping them (``withColumn``, ``filter``,
``select("*", ...)``) lets a record-wise function run in partitioned mode.
For SQL the runner adds them itself when the query is record-wise.

Invalid SQL, an unimportable callable, or output without a usable ``value``
column are configuration errors, found before the query starts.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eop_spark.contract.errors import ConfigError, one_line
from eop_spark.contract.spec import TransformSpec
from eop_spark.exactly_once.sink_contract import (
    PROVENANCE_COLUMNS,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    OutputLayout,
    has_provenance,
    output_layout,
)
from eop_spark.query.commit_mode import SOURCE_VIEW, sql_with_provenance

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: The columns of the ``source`` view, as documented in the spec.
SOURCE_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "headers")


@dataclass(frozen=True)
class Transformed:
    """The output stream and what the sink needs to know about it."""

    df: DataFrame
    layout: OutputLayout
    provenance: bool
    provenance_reason: str


def apply_transform(spark: SparkSession, kafka_df: DataFrame, spec: TransformSpec) -> Transformed:
    """Apply ``spec`` to the Kafka source stream and check the output against the sink contract."""
    from pyspark.sql import functions as F

    source = kafka_df.select(*SOURCE_COLUMNS)
    if spec.sql is not None:
        df, reason = _apply_sql(spark, source, spec.sql)
    else:
        assert spec.python is not None  # the spec's one_of guarantees it
        with_provenance = source.select(
            "*",
            F.col("topic").alias(SOURCE_TOPIC),
            F.col("partition").alias(SOURCE_PARTITION),
            F.col("offset").alias(SOURCE_OFFSET),
        )
        df = _apply_python(with_provenance, spec.python.module, spec.python.function)
        reason = "the Python transform dropped the __eop_src_* columns"
    dtypes = df.dtypes
    layout = output_layout(dtypes)
    provenance = has_provenance(dtypes)
    return Transformed(df, layout, provenance, "" if provenance else reason)


def _apply_sql(spark: SparkSession, source: DataFrame, sql: str) -> tuple[DataFrame, str]:
    source.createOrReplaceTempView(SOURCE_VIEW)
    original = _run_sql(spark, sql)
    rewrite = sql_with_provenance(sql)
    if rewrite.sql is None:
        return original, rewrite.reason
    try:
        rewritten = spark.sql(rewrite.sql)
    except Exception as exc:  # sqlglot produced something Spark reads differently
        return original, f"the SQL rewritten with provenance columns failed ({_spark_message(exc)})"
    kept = [f for f in rewritten.schema.fields if f.name not in PROVENANCE_COLUMNS]
    if [(f.name, f.dataType) for f in kept] != [(f.name, f.dataType) for f in original.schema]:
        return original, "the SQL rewritten with provenance columns changed the output schema"
    return rewritten, ""


def _run_sql(spark: SparkSession, sql: str) -> DataFrame:
    try:
        return spark.sql(sql)
    except Exception as exc:
        raise ConfigError(f"invalid transform SQL: {_spark_message(exc)}") from exc


def _apply_python(source: DataFrame, module_name: str, function_name: str) -> DataFrame:
    from pyspark.sql import DataFrame

    target = f"{module_name}.{function_name}"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"transform.python.module {module_name!r} cannot be imported: {exc}"
        ) from exc
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(
            f"transform.python.function {function_name!r} is not a function in {module_name}"
        )
    try:
        result: Any = function(source)
    except Exception as exc:
        raise ConfigError(f"transform {target} failed: {_spark_message(exc)}") from exc
    if not isinstance(result, DataFrame):
        raise ConfigError(f"transform {target} returned {type(result).__name__}, not a DataFrame")
    return result


def _spark_message(exc: BaseException) -> str:
    """The useful first part of a Spark error (its messages span many lines)."""
    text = getattr(exc, "getMessage", lambda: str(exc))() or str(exc)
    head = text.split("\n\n")[0].split("== SQL")[0]
    return one_line(head, limit=300)
