"""The coordinated commit mode: the driver commits each whole batch in one transaction.

Correct for any deterministic query, including aggregations and joins whose
output rows cannot be traced to one source partition.  For batch ``N`` the
driver reads ``[S_N, E_N)`` from the checkpoint's offsets log, reads G, and:

* G already holds batch ``N`` (its offsets carry this checkpoint's marker
  for ``N``, or cover ``E_N`` when the batch reads input): a replay, the
  output is visible; the batch is still computed (into Spark's ``noop``
  sink) because stateful operators commit their state only when it runs;
* G is at ``S_N`` (or has never seen a partition): produce the batch output,
  streamed partition by partition to the driver as Arrow record batches (see
  :func:`driver_batches`), and ``E_N`` for G in one transaction of
  ``<prefix>.driver``;
* G is past ``S_N`` but short of ``E_N``: some writer with other batch
  boundaries (another checkpoint) committed part of this input, and any
  output now would repeat it.  The runner stops with a clear error instead;
  a new checkpoint generation resumes from G.

The producer is kept across batches and rebuilt after a fatal error; its
``init_transactions`` fences a zombie runner of the same pipeline.

One batch is one transaction, which the broker aborts once it outlives the
transaction timeout, and a retry reads the same range (it is fixed in the
checkpoint): a batch must be small enough to write within the timeout
(invariant 10).  The transaction begins with the first output record, after
everything a shuffle computes first, and when the spec sets no
``maxOffsetsPerTrigger`` the runner bounds each batch's input to what the
driver writes in a third of the timeout (:func:`bounded_batches`).
"""

from __future__ import annotations

import logging
import math
import struct
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from eop_spark.contract.errors import EopError, ProducerFenced, ProgressConflict, after_transaction
from eop_spark.contract.offsets import Offsets, TopicPartition
from eop_spark.contract.run_config import RunConfig
from eop_spark.contract.spec import Duration
from eop_spark.exactly_once.batch_markers import (
    BatchAction,
    batch_marker,
    decide_batch,
    marked_batch,
)
from eop_spark.exactly_once.batch_result import BatchResult, BatchStatus
from eop_spark.exactly_once.cross_cluster import ProgressTopics
from eop_spark.exactly_once.keep_alive import refresh
from eop_spark.exactly_once.offsets_log import OffsetsLog
from eop_spark.exactly_once.progress_group import ProgressGroup
from eop_spark.exactly_once.retries import with_attempts
from eop_spark.exactly_once.sink_contract import OutputLayout, produce_arrow_batch
from eop_spark.exactly_once.sink_settings import SinkSettings
from eop_spark.kafka.transactional_producer import TransactionalProducer

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

MODE = "coordinated"

#: The one column of the rows that carry Arrow IPC streams to the driver.
_BLOB = "__eop_arrow_ipc"
#: Upper bound of the Arrow data in one such row (a Spark row is held whole in memory).
BLOB_BYTES = 4 << 20
#: Records per second the driver's one producer writes at the least, reading included (see
#: docs/performance.md, "Coordinated mode"): sizes the default batch bound.
DRIVER_RECORDS_PER_S = 100_000
#: A batch's transaction should live at most this share of the transaction timeout.
TIMEOUT_SHARE = 3


def default_batch_records(transaction_timeout: Duration) -> int:
    """The records one batch reads by default: what the driver writes in a third of the timeout.

    2,000,000 with the default 60 s, 33,333 with 1 s.
    """
    return max(1, DRIVER_RECORDS_PER_S * transaction_timeout.ms // 1000 // TIMEOUT_SHARE)


def bounded_batches(config: RunConfig) -> RunConfig:
    """``config`` with the default ``maxOffsetsPerTrigger`` when its spec sets none.

    For coordinated mode, whose batch is one transaction (the same object
    when the spec bounds batches itself).
    """
    kafka = config.source.kafka
    if kafka.max_offsets_per_trigger is not None:
        return config
    bound = default_batch_records(config.sink.kafka.transaction_timeout)
    source = config.source.model_copy(
        update={"kafka": kafka.model_copy(update={"max_offsets_per_trigger": bound})}
    )
    return config.model_copy(update={"source": source})


def _slices(batch: pa.RecordBatch, limit: int) -> Iterator[pa.RecordBatch]:
    pieces = max(1, math.ceil(batch.nbytes / limit))
    step = max(1, math.ceil(batch.num_rows / pieces))
    for offset in range(0, batch.num_rows, step):
        yield batch.slice(offset, step)


def to_ipc_blobs(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The Spark task body (``mapInArrow``): each output batch as one row of an Arrow IPC stream."""
    import pyarrow as pa

    for batch in batches:
        if batch.num_rows == 0:
            continue
        for piece in _slices(batch, BLOB_BYTES):
            stream = pa.BufferOutputStream()
            with pa.ipc.new_stream(stream, piece.schema) as writer:
                writer.write_batch(piece)
            data = stream.getvalue()
            offsets = pa.py_buffer(struct.pack("<ii", 0, data.size))
            blob = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, data])
            yield pa.RecordBatch.from_arrays([blob], names=[_BLOB])


def driver_batches(df: DataFrame) -> Iterator[pa.RecordBatch]:
    """``df``'s rows in the driver as Arrow record batches, in order, a partition at a time.

    ``toLocalIterator`` alone hands rows over one by one as pickled ``Row``
    objects, which for small records cost the driver more than everything
    else in the batch (and the records were then queued one by one).  Here the
    executors' Python workers pack each Arrow batch Spark gives them into one
    binary value (at most :data:`BLOB_BYTES` of Arrow data), so the driver
    receives a few large values per partition and queues them with
    :func:`~eop_spark.exactly_once.sink_contract.produce_arrow_batch`.  Memory stays what
    ``toLocalIterator(prefetchPartitions=True)`` needs, about two partitions,
    plus the batches the producer keeps until their records are delivered
    (about :data:`~eop_spark.kafka.transactional_producer.HOLD_LIMIT_BYTES` at most).
    """
    import pyarrow as pa

    blobs = df.mapInArrow(to_ipc_blobs, f"{_BLOB} binary")
    for row in blobs.toLocalIterator(prefetchPartitions=True):
        with pa.ipc.open_stream(pa.py_buffer(row[0])) as reader:
            yield from reader


class CoordinatedSink:
    """The foreachBatch body of the coordinated mode (runs in the driver)."""

    mode = MODE

    def __init__(
        self,
        sink: SinkSettings,
        offsets_log: OffsetsLog,
        layout: OutputLayout,
        progress: ProgressGroup,
        *,
        progress_topics: ProgressTopics | None = None,
    ) -> None:
        """Prepare; the producer is built (and fences older holders) at the first batch.

        ``progress_topics``: G's progress topics, when source and sink are
        different clusters (each batch's partitions are covered before it commits).
        """
        self.sink = sink
        self.offsets_log = offsets_log
        self.layout = layout
        self.progress = progress
        self.progress_topics = progress_topics
        self._producer: TransactionalProducer | None = None

    def _ready_producer(self) -> TransactionalProducer:
        if self._producer is not None and not self._producer.usable:
            self._producer.close()
            self._producer = None
        if self._producer is None:
            self._producer = self.sink.record_producer(self.sink.producer_config())
        return self._producer

    def __call__(self, df: DataFrame, batch_id: int) -> BatchResult:
        """Commit batch ``batch_id``, or recognise it as a replay."""
        query_id = self.offsets_log.query_id()
        start = self.offsets_log.start_offsets(batch_id)
        end = self.offsets_log.end_offsets(batch_id)
        failures: list[EopError] = []
        if self.progress_topics is not None:  # partitions or topics may have appeared
            self.progress_topics.cover(end)

        def attempt(_: int) -> BatchResult:
            # The producer's epoch predates this read, so a commit that succeeds
            # proves nobody moved G in between.
            producer = self._ready_producer()
            progress = self.progress.read(set(start) | set(end))
            decision = decide_batch(
                progress.offsets,
                start,
                end,
                batch_id=batch_id,
                committed_batch=marked_batch(progress.metadata, end, query_id),
            )
            if decision.action == BatchAction.SKIP:
                df.write.format("noop").mode("overwrite").save()
                return BatchResult(batch_id, MODE, BatchStatus.SKIPPED, 0, end, 0.0)
            if decision.action == BatchAction.CONFLICT:
                raise ProgressConflict(
                    f"batch {batch_id}: {decision.detail}; another runner with a different "
                    "checkpoint wrote this input; restart with a new checkpoint generation"
                )
            if decision.detail:
                log.warning("batch %d: %s", batch_id, decision.detail)
            started = time.monotonic()
            try:
                rows_out = 0
                for batch in driver_batches(df.select(*self.layout.columns())):
                    if not producer.in_transaction:  # open only while records are written
                        started = time.monotonic()
                        producer.begin()
                    rows_out += produce_arrow_batch(producer, self.sink.topic, batch, self.layout)
                if not producer.in_transaction:
                    started = time.monotonic()
                    producer.begin()
                producer.send_offsets(
                    end,
                    self.sink.group_metadata,
                    batch_marker(query_id, batch_id),
                    names=self.sink.progress,
                )
                producer.commit()
            except BaseException as exc:
                opened = producer.in_transaction
                producer.abort()
                if not opened:
                    raise
                error = after_transaction(
                    exc,
                    f"the transaction of {self.sink.transactional_id()} (batch {batch_id})",
                    time.monotonic() - started,
                    self.sink.transaction_timeout.ms,
                )
                if error is exc:
                    raise
                raise error from exc
            txn_ms = (time.monotonic() - started) * 1000.0
            return BatchResult(
                batch_id, MODE, BatchStatus.COMMITTED, rows_out, end, txn_ms, transactions=1
            )

        result = with_attempts(f"batch {batch_id}", attempt, on_retry=failures.append)
        result.fenced = sum(isinstance(error, ProducerFenced) for error in failures)
        result.aborted = len(failures)
        return result

    def refresh_progress(self, partitions: Iterable[TopicPartition]) -> Offsets:
        """Re-commit what G holds, under this sink's producer (between batches only).

        The producer (``<prefix>.driver``, the only id this mode moves G with)
        is initialised before G is read, as for a batch; see
        :mod:`eop_spark.exactly_once.keep_alive`.
        """
        return refresh(self._ready_producer(), self.progress, partitions, self.sink.group_metadata)

    def close(self) -> None:
        """Release the producer."""
        if self._producer is not None:
            self._producer.close()
            self._producer = None
