"""The coordinated commit mode: the driver commits each whole batch in one transaction.

Correct for any deterministic query, including aggregations and joins whose
output rows cannot be traced to one source partition.  For batch ``N`` the
driver reads ``[S_N, E_N)`` from the checkpoint's offsets log, reads G, and:

* G already holds batch ``N`` (its offsets carry this checkpoint's marker
  for ``N``, or cover ``E_N`` when the batch reads input): a replay, the
  output is visible; the batch is still computed (into Spark's ``noop``
  sink) because stateful operators commit their state only when it runs;
* G is at ``S_N`` (or has never seen a partition): produce the batch output,
  streamed partition by partition to the driver, and ``E_N`` for G in one
  transaction of ``<prefix>.driver``;
* G is past ``S_N`` but short of ``E_N``: some writer with other batch
  boundaries (another checkpoint) committed part of this input, and any
  output now would repeat it.  The runner stops with a clear error instead;
  a new checkpoint generation resumes from G.

The producer is kept across batches and rebuilt after a fatal error; its
``init_transactions`` fences a zombie runner of the same pipeline.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from eop_spark.attempts import with_attempts
from eop_spark.batch_log import BatchResult, BatchStatus
from eop_spark.errors import EopError, ProducerFenced, ProgressConflict
from eop_spark.offsets import BatchAction, batch_marker, decide_batch, marked_batch
from eop_spark.offsets_log import OffsetsLog
from eop_spark.progress import ProgressGroup
from eop_spark.sink_contract import OutputLayout, produce_rows
from eop_spark.sink_settings import SinkSettings
from eop_spark.transactions import TransactionalProducer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

MODE = "coordinated"


class CoordinatedSink:
    """The foreachBatch body of the coordinated mode (runs in the driver)."""

    mode = MODE

    def __init__(
        self,
        sink: SinkSettings,
        offsets_log: OffsetsLog,
        layout: OutputLayout,
        progress: ProgressGroup,
    ) -> None:
        """Prepare; the producer is built (and fences older holders) at the first batch."""
        self.sink = sink
        self.offsets_log = offsets_log
        self.layout = layout
        self.progress = progress
        self._producer: TransactionalProducer | None = None

    def _ready_producer(self) -> TransactionalProducer:
        if self._producer is not None and not self._producer.usable:
            self._producer.close()
            self._producer = None
        if self._producer is None:
            self._producer = TransactionalProducer(self.sink.producer_config())
        return self._producer

    def __call__(self, df: DataFrame, batch_id: int) -> BatchResult:
        """Commit batch ``batch_id``, or recognise it as a replay."""
        query_id = self.offsets_log.query_id()
        start = self.offsets_log.start_offsets(batch_id)
        end = self.offsets_log.end_offsets(batch_id)
        failures: list[EopError] = []

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
            producer.begin()
            try:
                rows = df.select(*self.layout.columns()).toLocalIterator(prefetchPartitions=True)
                rows_out = produce_rows(producer, self.sink.topic, rows, self.layout)
                producer.send_offsets(
                    end, self.sink.group_metadata, batch_marker(query_id, batch_id)
                )
                producer.commit()
            except BaseException:
                producer.abort()
                raise
            txn_ms = (time.monotonic() - started) * 1000.0
            return BatchResult(
                batch_id, MODE, BatchStatus.COMMITTED, rows_out, end, txn_ms, transactions=1
            )

        result = with_attempts(f"batch {batch_id}", attempt, on_retry=failures.append)
        result.fenced = sum(isinstance(error, ProducerFenced) for error in failures)
        result.aborted = len(failures)
        return result

    def close(self) -> None:
        """Release the producer."""
        if self._producer is not None:
            self._producer.close()
            self._producer = None
