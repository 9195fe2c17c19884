"""The output contract, as Spark's Kafka sink defines it, and the records it yields.

A transform's output must have ``value`` (string or binary); ``key`` (string
or binary), ``headers`` (array of struct<key: string, value: binary>) and
``partition`` (int: the *target* partition) are optional; ``topic`` is
ignored because the sink topic comes from the spec (Spark's ``topic`` option
overrides the column the same way).  Other columns are ignored.

Record-wise pipelines also carry *provenance*: the source topic, partition
and offset of each output row, under names no user column is expected to
have (``__eop_src_*``), so the partitioned sink knows which input each
output belongs to.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eop_spark.contract.errors import ConfigError
from eop_spark.kafka.transactional_producer import TransactionalProducer

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

VALUE = "value"
KEY = "key"
HEADERS = "headers"
PARTITION = "partition"
TOPIC = "topic"

SOURCE_TOPIC = "__eop_src_topic"
SOURCE_PARTITION = "__eop_src_partition"
SOURCE_OFFSET = "__eop_src_offset"
#: Provenance columns, in this order: source topic, source partition, source offset.
PROVENANCE_COLUMNS = (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET)


@dataclass(frozen=True)
class OutputLayout:
    """Which optional sink columns the output has; rows are read in :meth:`columns` order."""

    has_key: bool = False
    has_headers: bool = False
    has_partition: bool = False

    def columns(self) -> list[str]:
        """The output columns the sink reads, value first."""
        names = [VALUE]
        names += [KEY] if self.has_key else []
        names += [HEADERS] if self.has_headers else []
        names += [PARTITION] if self.has_partition else []
        return names


def output_layout(fields: Sequence[tuple[str, str]]) -> OutputLayout:
    """Check a transform's output columns against the sink contract.

    ``fields`` are ``(name, Spark simple type string)`` pairs, e.g.
    ``("value", "string")``, as ``DataFrame.dtypes`` gives them.  Raises
    :class:`~eop_spark.contract.errors.ConfigError` with a one-line reason.
    """
    types = {name.lower(): dtype for name, dtype in fields}
    if VALUE not in types:
        names = ", ".join(name for name, _ in fields if name not in PROVENANCE_COLUMNS)
        raise ConfigError(
            f"the transform's output has no 'value' column (columns: {names}); "
            "the Kafka sink needs value (string or binary), optionally key, headers, partition"
        )
    _expect(types, VALUE, {"string", "binary"})
    if KEY in types:
        _expect(types, KEY, {"string", "binary"})
    if HEADERS in types:
        _expect(types, HEADERS, {"array<struct<key:string,value:binary>>"})
    if PARTITION in types:
        _expect(types, PARTITION, {"int"})
    return OutputLayout(KEY in types, HEADERS in types, PARTITION in types)


def _expect(types: dict[str, str], column: str, allowed: set[str]) -> None:
    if types[column] not in allowed:
        raise ConfigError(
            f"output column {column!r} has type {types[column]}; "
            f"the Kafka sink needs {' or '.join(sorted(allowed))}"
        )


def has_provenance(fields: Sequence[tuple[str, str]]) -> bool:
    """Whether the output kept the source topic, partition and offset of each row."""
    names = {name for name, _ in fields}
    return all(column in names for column in PROVENANCE_COLUMNS)


def _bytes(value: Any) -> Any:
    # Spark hands binary columns to Python as bytearray; librdkafka wants bytes or str.
    return bytes(value) if isinstance(value, bytearray) else value


def _headers(headers: Any) -> list[tuple[str, bytes | None]] | None:
    if not headers:
        return None
    return [(h["key"], _bytes(h["value"])) for h in headers]


def produce_columns(
    producer: TransactionalProducer,
    topic: str,
    columns: Sequence[list[Any]],
    layout: OutputLayout,
) -> int:
    """Produce rows given column-wise (``layout.columns()`` order, as Arrow's ``to_pylist``).

    Arrow hands binary columns over as ``bytes``, which librdkafka takes as they
    are: the common shape (value, optionally key) goes record by record
    straight from the column lists, with nothing built per record.
    """
    if layout.has_headers or layout.has_partition:
        return produce_rows(producer, topic, zip(*columns, strict=True), layout)
    values = columns[0]
    producer.produce_pairs(topic, values, columns[1] if layout.has_key else [None] * len(values))
    return len(values)


def produce_arrow_batch(
    producer: TransactionalProducer, topic: str, batch: pa.RecordBatch, layout: OutputLayout
) -> int:
    """Produce the rows of an Arrow batch holding (at least) ``layout.columns()``.

    The common shape (value, optionally key) goes to librdkafka as Arrow
    columns when the producer takes them (:mod:`eop_spark.speedups.native_produce`);
    headers or a target partition, row by row through ``produce()``.
    """
    if producer.takes_arrow and not (layout.has_headers or layout.has_partition):
        producer.produce_arrow(
            topic, batch.column(VALUE), batch.column(KEY) if layout.has_key else None
        )
        return int(batch.num_rows)
    lists = [batch.column(name).to_pylist() for name in layout.columns()]
    return produce_columns(producer, topic, lists, layout)


def produce_rows(
    producer: TransactionalProducer,
    topic: str,
    rows: Iterable[Sequence[Any]],
    layout: OutputLayout,
) -> int:
    """Produce rows laid out as ``layout.columns()`` one by one (headers, target partition)."""
    count = 0
    key_at = 1 if layout.has_key else None
    headers_at = 1 + layout.has_key if layout.has_headers else None
    partition_at = 1 + layout.has_key + layout.has_headers if layout.has_partition else None
    for row in rows:
        kwargs: dict[str, Any] = {}
        if headers_at is not None and (headers := _headers(row[headers_at])):
            kwargs["headers"] = headers
        if partition_at is not None and row[partition_at] is not None:
            kwargs["partition"] = row[partition_at]
        key = _bytes(row[key_at]) if key_at is not None else None
        producer.produce_one(topic, _bytes(row[0]), key, kwargs)
        count += 1
    return count
