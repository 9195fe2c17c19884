"""The foreachBatch entry point: runs the sink, and lets a stop wait for the batch in flight."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from eop_spark.contract.errors import EopError, from_failure
from eop_spark.exactly_once.batch_result import BatchResult
from eop_spark.exactly_once.coordinated import CoordinatedSink
from eop_spark.exactly_once.partitioned.driver import PartitionedSink
from eop_spark.runtime.metrics import Counters

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: The sink a run's batches go through (the first batch may replace a partitioned one).
Sink = PartitionedSink | CoordinatedSink


class StopRequested(Exception):
    """Raised in a batch that starts after a stop was asked: it is left for the next run."""


class BatchGate:
    """The foreachBatch entry point: runs the sink, and lets a stop wait for the batch in flight.

    Stopping a Spark query interrupts the batch that runs, so a graceful stop
    first closes the gate (no new batch starts its sink work) and waits until
    the batch in flight has committed; only then is the query stopped.
    """

    def __init__(
        self,
        sink: Sink,
        counters: Counters,
        confirm_plan: Callable[[Sink], Sink] | None = None,
        after_batch: Callable[[BatchResult], None] | None = None,
    ) -> None:
        """``confirm_plan`` may replace the sink at the first batch (after seeing its plan).

        ``after_batch`` is told each completed batch's result (it must not block).
        """
        self.sink = sink
        self.counters = counters
        self._confirm_plan = confirm_plan
        self._after_batch = after_batch
        self._lock = threading.Condition()
        self._stopping = False
        self._in_flight = False
        self._held = False  # by between_batches: no batch may start
        self.idle = threading.Event()
        self.results: dict[int, BatchResult] = {}
        self.failure: EopError | None = None
        #: The last batch whose sink work completed (Spark records it in its commit log after).
        self.last_completed: int | None = None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """The ``foreachBatch`` function."""
        with self._lock:
            self._lock.wait_for(lambda: not self._held)
            if self._stopping:
                raise StopRequested(f"stopping: batch {batch_id} is left for the next run")
            self._in_flight = True
        try:
            if self._confirm_plan is not None:
                self.sink = self._confirm_plan(self.sink)
                self._confirm_plan = None
            started = time.monotonic()
            result = self.sink(df, batch_id)
            self.counters.record(result, seconds=time.monotonic() - started)
            if self._after_batch is not None:
                self._after_batch(result)
            with self._lock:
                self.results[batch_id] = result
                self.last_completed = batch_id
        except Exception as exc:
            self.failure = from_failure(exc)
            raise
        finally:
            with self._lock:
                self._in_flight = False
                self._lock.notify_all()
                if self._stopping:
                    self.idle.set()

    @contextlib.contextmanager
    def between_batches(self) -> Iterator[None]:
        """Wait until no batch is in flight, and let none start until the block ends."""
        with self._lock:
            self._lock.wait_for(lambda: not self._in_flight and not self._held)
            self._held = True
        try:
            yield
        finally:
            with self._lock:
                self._held = False
                self._lock.notify_all()

    def close(self) -> None:
        """Let no new batch start; :attr:`idle` is set once none is in flight."""
        with self._lock:
            self._stopping = True
            if not self._in_flight:
                self.idle.set()

    def put_back(self, results: list[BatchResult]) -> None:
        """Return results to log later."""
        with self._lock:
            self.results.update({r.batch_id: r for r in results})

    def take_results(self) -> list[BatchResult]:
        """The batch results not taken yet, in batch order."""
        with self._lock:
            results = [self.results.pop(b) for b in sorted(self.results)]
        return results
