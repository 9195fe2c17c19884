"""The partitioned sink's driver side: the foreachBatch body, and the JVM path of its tasks.

:class:`PartitionedSink` runs a batch's tasks (in the executors' JVM through
:class:`JvmTasks`, else in Python workers through
:func:`~eop_spark.exactly_once.partitioned.task.write_partition`), then the
offsets-only commits for the partitions no task reported on, so that G reaches
the batch's end offsets.  The protocol and the table of task paths are in the
package's docstring (:mod:`eop_spark.exactly_once.partitioned`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from eop_spark.contract.offsets import Offsets, TopicPartition
from eop_spark.contract.progress_names import ProgressNames
from eop_spark.exactly_once.batch_markers import batch_marker
from eop_spark.exactly_once.batch_result import BatchResult, BatchStatus
from eop_spark.exactly_once.cross_cluster import ProgressTopics
from eop_spark.exactly_once.offsets_log import OffsetsLog
from eop_spark.exactly_once.partitioned import jvm_writer
from eop_spark.exactly_once.partitioned.task import (
    BATCH_PROPERTY,
    STATS_SCHEMA,
    PartitionOutcome,
    PartitionTask,
    TaskFunction,
    TaskHandOff,
    commit_partition,
    encode_batch,
    write_partition,
)
from eop_spark.exactly_once.retries import with_attempts
from eop_spark.exactly_once.sink_contract import OutputLayout
from eop_spark.exactly_once.sink_settings import SinkSettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

MODE = "partitioned"


class JvmTasks:
    """A run's partitioned tasks in the JVM writer: its class (through py4j), its settings."""

    def __init__(self, writer: Any, settings: dict[str, Any], progress: ProgressNames) -> None:
        """``settings``: what ``PartitionedWriter`` reads (as JSON); ``progress``: G's names."""
        self.writer = writer
        self._settings = settings
        self.settings = json.dumps(settings)
        self.prefix = str(settings["prefix"])
        self.progress = progress
        self.prepared = False

    @classmethod
    def decide(
        cls,
        spark: SparkSession,
        sink: SinkSettings,
        java_config: dict[str, str],
        run: str,
        partitions: Sequence[TopicPartition],
    ) -> JvmTasks | None:
        """The JVM writer for ``run``'s tasks, or None when they stay in Python workers.

        ``java_config``: every sink client property, the Java clients' own ones
        too (``client_config.sink_java_config``); ``partitions``: the run's
        source partitions (one id each).
        """
        from py4j.java_gateway import JavaClass  # type: ignore[import-untyped]

        if os.environ.get(jvm_writer.NO_JVM_WRITER_ENV) == "1":
            return None
        writer = spark.sparkContext._jvm  # each name is a py4j round trip: looked up once
        for name in jvm_writer.CLASS.split("."):
            writer = getattr(writer, name)
        if not isinstance(writer, JavaClass):
            return None  # the jar is not on the session's class path
        timeout = sink.transaction_timeout.ms
        java = jvm_writer.java_settings(spark, java_config, timeout, len(partitions))
        if java is None:
            return None
        topics = sink.progress.topic_map(t for t, _ in partitions)
        settings = jvm_writer.writer_settings(
            sink.topic, sink.transactional_id_prefix, sink.group, run, *java, topics
        )
        return cls(writer, json.loads(settings), sink.progress)

    def cover(self, partitions: Iterable[TopicPartition]) -> None:
        """Name the progress topics of source topics new to this run (a topic pattern's).

        A no-op when G keeps its offsets under the source names.
        """
        known = self._settings["progressTopics"]
        if known is None:
            return
        new = {t for t, _ in partitions} - known.keys()
        if new:
            known.update(self.progress.topic_map(new) or {})
            self.settings = json.dumps(self._settings)

    def prepare(self, spark: SparkSession, partitions: Iterable[TopicPartition]) -> None:
        """Have the JVM take the partitions' ids and read G for them while the query starts.

        Only where the driver's JVM runs the tasks (local mode).  These are the
        first steps of each task of the run's first batch
        (``PartitionedWriter.prepare``); call it after the run's take-over and
        any reset of G.
        """
        if jvm_writer.tasks_run_in_driver(spark):
            self.writer.prepare(self.settings, json.dumps([[t, p] for t, p in partitions]))
            self.prepared = True

    def release(self) -> None:
        """Close the producers :meth:`prepare` built (the run commits otherwise after all)."""
        if self.prepared:
            self.writer.release(self.prefix)
            self.prepared = False


class PartitionedSink:
    """The driver side: run the tasks, then advance G for partitions no task committed."""

    mode = MODE

    def __init__(
        self,
        sink: SinkSettings,
        offsets_log: OffsetsLog,
        layout: OutputLayout,
        jvm: JvmTasks | None,
        run: str,
        *,
        progress_topics: ProgressTopics | None = None,
        hand_off: TaskHandOff | None = None,
    ) -> None:
        """``jvm``: where the tasks run (None: Python workers), decided for ``run``.

        ``progress_topics``: G's progress topics, when source and sink are
        different clusters (each batch's partitions are covered before it commits).
        ``hand_off``: where else in an executor a Python task may commit (the
        producer hub the runner plugs in; None: in the worker that runs it).
        """
        self.sink = sink
        self.offsets_log = offsets_log
        self.layout = layout
        self.jvm = jvm
        self.progress_topics = progress_topics
        self._function = TaskFunction(sink, layout, run, hand_off)
        self._udf: Any = None
        #: Per set of column names: the columns and their Java sequence; the task function.
        self._jobs: dict[tuple[str, ...], tuple[list[Any], Any]] = {}
        self._functions: dict[tuple[str, ...], Any] = {}
        where = "the executors' JVM" if jvm is not None else "Python workers"
        log.info("partitioned sink: tasks commit in %s", where)

    def __call__(self, df: DataFrame, batch_id: int) -> BatchResult:
        """Commit batch ``batch_id`` (the foreachBatch body)."""
        end = self.offsets_log.end_offsets(batch_id)
        marker = batch_marker(self.offsets_log.query_id(), batch_id)
        function = self._function
        task = PartitionTask(self.sink, end, self.layout, marker, function.run, function.hand_off)
        outcomes: list[PartitionOutcome] = []
        jvm = self.jvm
        if self.progress_topics is not None:  # partitions or topics may have appeared
            self.progress_topics.cover(end)
            if jvm is not None:
                jvm.cover(end)

        def attempt(_: int) -> None:
            outcomes.clear()
            if jvm is None:
                rows = [row.asDict() for row in self._run_tasks(df, task)]
            else:
                rows = self._run_jvm_tasks(df, task, jvm)
            outcomes.extend(PartitionOutcome(**row) for row in rows)
            outcomes.extend(self._advance_the_rest(task, outcomes, jvm))

        failures: list[object] = []
        with_attempts(f"batch {batch_id}", attempt, on_retry=failures.append)
        result = summarize(batch_id, end, outcomes)
        # A failed attempt's transactions were aborted (by the task, or by the next init).
        result.aborted += len(failures)
        return result

    def _run_jvm_tasks(self, df: DataFrame, task: PartitionTask, jvm: JvmTasks) -> list[Any]:
        """Run the batch's tasks in the JVM writer; return their outcomes."""
        _, _, jcolumns = self._columns(df, task)
        with _batch_property(df, task):
            return [json.loads(o) for o in jvm.writer.write(df._jdf.select(jcolumns), jvm.settings)]

    def _run_tasks(self, df: DataFrame, task: PartitionTask) -> list[Any]:
        """Run ``write_partition`` on the batch's rows; return the tasks' outcome rows.

        This is ``df.select(columns).mapInArrow(write_partition).collect()`` with
        the parts that do not change between batches built once: the task
        function (pickled, registered with the JVM) and the Java columns, which
        name their input unresolved so that every batch's plan resolves them.
        Rebuilding them took ~60 py4j round trips, ~40-60 ms per batch on 2 cores,
        while no task runs.
        """
        if self._udf is None:
            from pyspark.sql.pandas.functions import pandas_udf
            from pyspark.util import PythonEvalType

            self._udf = pandas_udf(  # type: ignore[call-overload]
                functools.partial(write_partition, self._function),
                returnType=STATS_SCHEMA,
                functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF,
            )
        names, selected, jcolumns = self._columns(df, task)
        if names not in self._functions:
            self._functions[names] = self._udf(*selected)._jc
        with _batch_property(df, task):
            # What DataFrame.mapInArrow does, with the function column built above.
            jdf = df._jdf.select(jcolumns).mapInArrow(self._functions[names], False, None)
            return list(type(df)(jdf, df.sparkSession).collect())

    def _columns(
        self, df: DataFrame, task: PartitionTask
    ) -> tuple[tuple[str, ...], list[Any], Any]:
        """The names of the columns the tasks read, the columns, their Java sequence.

        Built once per set of names: unresolved names, which every batch's plan resolves.
        """
        from pyspark.sql import functions as F

        names = (*self.layout.columns(), *task.provenance())
        if names not in self._jobs:
            selected = [F.col(name) for name in names]
            jcolumns = df.sparkSession.sparkContext._jvm.PythonUtils.toSeq(  # type: ignore[union-attr]
                [c._jc for c in selected]
            )
            self._jobs[names] = (selected, jcolumns)
        return (names, *self._jobs[names])

    def _advance_the_rest(
        self, task: PartitionTask, outcomes: Sequence[PartitionOutcome], jvm: JvmTasks | None
    ) -> list[PartitionOutcome]:
        """Offsets-only transactions for the partitions no task brought to the batch end.

        Every task succeeded, so those partitions had no output rows in this
        batch (or no task at all), or no rows after the offset their task left
        G at (a Python task moves G only over the rows it saw: ``short``).
        Each goes through the same steps as a task (take the id, read G, skip
        or commit), so G reaches the batch end; with the JVM writer, in the
        driver's JVM (in local mode the tasks' own, so the producers are the
        same and nothing is fenced).
        """
        reported = {(o.topic, o.partition) for o in outcomes if not o.short}
        rest = sorted(tp for tp in task.end_offsets if tp not in reported)
        if jvm is None:
            return [commit_partition(task, tp, ()) for tp in rest]
        batch = encode_batch(task.end_offsets, task.marker)
        return [
            PartitionOutcome(**json.loads(jvm.writer.advance(jvm.settings, batch, t, p)))
            for t, p in rest
        ]


@contextlib.contextmanager
def _batch_property(df: DataFrame, task: PartitionTask) -> Iterator[None]:
    """Give the jobs started inside the block the batch's :data:`BATCH_PROPERTY`."""
    jsc = df.sparkSession.sparkContext._jsc
    jsc.setLocalProperty(BATCH_PROPERTY, encode_batch(task.end_offsets, task.marker))
    try:
        yield
    finally:
        jsc.setLocalProperty(BATCH_PROPERTY, None)


def summarize(batch_id: int, end: Offsets, outcomes: Sequence[PartitionOutcome]) -> BatchResult:
    """One batch result from the partitions' outcomes."""
    committed = [o for o in outcomes if o.status == BatchStatus.COMMITTED]
    skipped = [o for o in outcomes if o.status == BatchStatus.SKIPPED]
    if not committed:
        status = BatchStatus.SKIPPED
    elif skipped:
        status = BatchStatus.PARTIAL_REPLAY
    else:
        status = BatchStatus.COMMITTED
    return BatchResult(
        batch_id=batch_id,
        mode=MODE,
        status=status,
        rows_out=sum(o.rows_out for o in committed),
        offsets=end,
        txn_ms=max((o.txn_ms for o in committed), default=0.0),
        transactions=len(committed),
        skipped_partitions=len(skipped),
        fenced=sum(o.fenced for o in outcomes),
        aborted=sum(o.aborted for o in outcomes),
    )
