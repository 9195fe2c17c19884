"""Start a run's streaming query: six steps that must run in this order.

1. :meth:`QueryStart.take_over_ids`: initialise every transactional id of the
   pipeline, which fences older holders (a crashed or zombie runner) and aborts
   what they left open; until then a stable read of G waits, and a zombie
   could still commit;
2. :meth:`QueryStart.reset_progress`: refuse a lost checkpoint, and set G to
   ``startingOffsets`` for a stateless generation (after 1: no transaction may
   still move G);
3. :meth:`QueryStart.prepare_jvm`: the JVM writer of the partitioned tasks, if
   the run may commit partitioned; in local mode the JVM takes the run's ids
   and reads G for the first batch now (after 1 and 2, so it reads the G they
   left), while steps 4 to 6 go on in Python;
4. :meth:`QueryStart.read_progress`: where the query starts, from G on a new
   checkpoint generation (after 2);
5. :meth:`QueryStart.build_stream`: the source from those offsets, the
   transform, the state guards and the commit mode (chosen here, once);
6. :meth:`QueryStart.start_stream`: start the query; its first batch confirms
   the commit mode on the physical plan, which exists only then.

Each step takes what the step it needs returns (:class:`IdsTaken`,
:class:`ProgressReady`, :class:`~eop_spark.query.source.StartingPoint`,
:class:`Stream`), so they cannot run out of order; :meth:`QueryStart.run`
calls them in sequence.  Step 3 comes before 4 only so that the JVM's reads
overlap Python's planning.
"""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eop_spark.contract.errors import ConfigError, from_failure
from eop_spark.contract.offsets import TopicPartition
from eop_spark.contract.run_config import RunConfig
from eop_spark.contract.spec import CommitMode
from eop_spark.exactly_once.batch_result import BatchResult
from eop_spark.exactly_once.coordinated import CoordinatedSink, bounded_batches
from eop_spark.exactly_once.cross_cluster import LagView, ProgressTopics
from eop_spark.exactly_once.generation_guards import check_checkpoint_kept
from eop_spark.exactly_once.offsets_log import HadoopFiles, LocalFiles, OffsetsLog, is_local
from eop_spark.exactly_once.partitioned.driver import JvmTasks, PartitionedSink
from eop_spark.exactly_once.partitioned.task import TaskHandOff
from eop_spark.exactly_once.progress_group import ProgressGroup
from eop_spark.exactly_once.sink_settings import SinkSettings, take_over
from eop_spark.exactly_once.stateless_reset import reset_for_stateless_generation
from eop_spark.query.commit_mode import (
    ModeChoice,
    choose_mode,
    confirm_mode,
    logical_blockers,
    partitioned_possible,
)
from eop_spark.query.source import StartingPoint, read_kafka, resolve_starting_offsets
from eop_spark.query.state_guards import check_state_kept, check_state_store_reachable
from eop_spark.query.transform import Transformed, apply_transform
from eop_spark.runtime.batch_gate import BatchGate, Sink
from eop_spark.runtime.metrics import Counters
from eop_spark.speedups.malloc_tuning import keep_freed_memory

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

#: How long the first batch waits for the query to have started before it looks at the plan.
PLAN_WAIT_S = 60


@dataclass(frozen=True)
class IdsTaken:
    """Step 1 done: this run holds every transactional id of the pipeline."""

    count: int


@dataclass(frozen=True)
class ProgressReady:
    """Step 2 done: G is what this run starts from (reset, for a stateless generation)."""

    ids: IdsTaken


@dataclass(frozen=True)
class Stream:
    """Step 5's result: the output stream, and the commit mode chosen for it."""

    transformed: Transformed
    choice: ModeChoice


@dataclass
class QueryStart:
    """What the six steps share: the run's configuration, Spark, G and the sink settings."""

    config: RunConfig
    spark: SparkSession
    partitions: list[TopicPartition]
    sink_conf: dict[str, str]
    #: Every sink client property, the Java clients' own too (for the JVM writer).
    java_config: dict[str, str]
    progress: ProgressGroup
    settings: SinkSettings
    counters: Counters
    #: Where a partitioned task's rows may be committed in another process (a speed-up).
    hand_off: TaskHandOff | None = None
    progress_topics: ProgressTopics | None = None
    lag_view: LagView | None = None

    def __post_init__(self) -> None:
        """The checkpoint's offsets log, and an id for this run of the sink."""
        location = self.config.checkpoint_location
        files = LocalFiles() if is_local(location) else HadoopFiles(self.spark)
        self.offsets_log = OffsetsLog(location, files)
        #: What a producer knows of G holds within one run of the sink only.
        self.run_id = uuid.uuid4().hex

    def run(self, taken: Future[int] | None = None) -> tuple[StreamingQuery, BatchGate]:
        """The six steps in order (``taken``: step 1 already under way in a thread)."""
        ready = self.reset_progress(self.take_over_ids(taken))
        jvm = self.prepare_jvm(ready)
        stream = self.build_stream(self.read_progress(ready))
        return self.start_stream(stream, jvm)

    def take_over_ids(self, taken: Future[int] | None = None) -> IdsTaken:
        """Step 1: initialise every transactional id (or wait for ``taken`` to have)."""
        count = taken.result() if taken is not None else take_over(self.settings, self.partitions)
        log.info("took over %d transactional ids %s.*", count, self.config.transactional_id_prefix)
        return IdsTaken(count)

    def reset_progress(self, ids: IdsTaken) -> ProgressReady:
        """Step 2: refuse a lost checkpoint; reset G for a stateless generation."""
        config, offsets_log = self.config, self.offsets_log
        if offsets_log.is_new():
            # Before anything acts on an empty checkpoint (a stateless generation's reset).
            check_checkpoint_kept(config, offsets_log.files)
        reset_for_stateless_generation(
            config, offsets_log, self.partitions, self.sink_conf, self.progress.names
        )
        if self.lag_view is not None:  # G as this run finds it (a killed run may not have told)
            self.lag_view.publish(self.progress.committed(self.partitions))
        return ProgressReady(ids)

    def prepare_jvm(self, ready: ProgressReady) -> JvmTasks | None:
        """Step 3: where partitioned tasks of this run would commit (None: in Python workers).

        In local mode the JVM starts their first steps at once (taking the ids,
        reading G), while the query is planned and started.
        """
        if not partitioned_possible(self.config.sink.kafka.commit_mode):
            return None
        spark = self.spark
        jvm = JvmTasks.decide(spark, self.settings, self.java_config, self.run_id, self.partitions)
        if jvm is not None:
            jvm.prepare(spark, self.partitions)
        return jvm

    def read_progress(self, ready: ProgressReady) -> StartingPoint:
        """Step 4: Spark's ``startingOffsets`` for this run (from G on a new generation)."""
        start = resolve_starting_offsets(
            self.config, self.offsets_log, self.progress, self.partitions
        )
        log.info("%s", start.why)
        return start

    def build_stream(self, start: StartingPoint) -> Stream:
        """Step 5: source, transform, the state guards and the commit mode.

        In coordinated mode a batch is one transaction, so its input is bounded
        (``bounded_batches``) unless the spec bounds it: the stream is built
        again with that bound.
        """
        config, spark = self.config, self.spark
        transformed = apply_transform(
            spark, read_kafka(spark, config, start.offsets), config.transform
        )
        analyzed = str(transformed.df._jdf.queryExecution().analyzed().toString())
        check_state_kept(config, analyzed, start.resumes_progress)
        check_state_store_reachable(config, analyzed)
        choice = choose_mode(
            config.sink.kafka.commit_mode,
            logical_blockers(analyzed),
            transformed.provenance,
            transformed.provenance_reason,
        )
        log.info("commit mode %s: %s", choice.mode.value, choice.reason)
        bounded = bounded_batches(config)
        if choice.mode == CommitMode.COORDINATED and bounded is not config:
            bound = bounded.source.kafka.max_offsets_per_trigger
            log.info("batches read at most %s records (sink.kafka.transactionTimeout)", bound)
            df = read_kafka(spark, bounded, start.offsets)
            transformed = apply_transform(spark, df, config.transform)
        return Stream(transformed, choice)

    def start_stream(
        self, stream: Stream, jvm: JvmTasks | None
    ) -> tuple[StreamingQuery, BatchGate]:
        """Step 6: the sink for the chosen mode, the query started; the first batch confirms."""
        layout = stream.transformed.layout
        coordinated = CoordinatedSink(
            self.settings,
            self.offsets_log,
            layout,
            self.progress,
            progress_topics=self.progress_topics,
        )
        sink: Sink = coordinated
        if stream.choice.mode == CommitMode.PARTITIONED:
            sink = PartitionedSink(
                self.settings,
                self.offsets_log,
                layout,
                jvm,
                self.run_id,
                progress_topics=self.progress_topics,
                hand_off=self.hand_off,
            )
        else:
            if jvm is not None:
                jvm.release()
            keep_freed_memory()  # this process moves every record (the workers do it themselves)
        started: list[StreamingQuery] = []
        ready = threading.Event()

        def confirm_plan(current: Sink) -> Sink:
            # The physical plan exists only once a batch is planned: check it at the first one.
            if not isinstance(current, PartitionedSink) or not ready.wait(PLAN_WAIT_S):
                return current
            plan = started[0]._jsq.streamingQuery().lastExecution().executedPlan().toString()
            after_all = confirm_mode(self.config.sink.kafka.commit_mode, str(plan))
            if after_all is None:
                return current
            log.warning("commit mode coordinated after all: %s", after_all.reason)
            if jvm is not None:
                jvm.release()
            return coordinated

        after_batch = self._publish_lag if self.lag_view is not None else None
        gate = BatchGate(sink, self.counters, confirm_plan, after_batch)
        try:
            started.append(self.writer(stream.transformed.df, gate).start())
        except Exception as exc:
            raise ConfigError(f"the query cannot start: {from_failure(exc).message}") from exc
        ready.set()
        return started[0], gate

    def _publish_lag(self, result: BatchResult) -> None:
        """Note a completed batch's end offsets for the lag view (its thread commits them)."""
        if self.lag_view is not None:
            self.lag_view.publish(result.offsets)

    def writer(self, df: DataFrame, gate: BatchGate) -> Any:
        """The stream writer: foreachBatch into ``gate``, checkpoint, output mode, trigger."""
        config = self.config
        writer = (
            df.writeStream.foreachBatch(gate)
            .option("checkpointLocation", config.checkpoint_location)
            .outputMode(config.transform.output_mode.value)
            .queryName(config.pipeline.replace(".", "_").replace("-", "_"))
        )
        if config.trigger.available_now:
            return writer.trigger(availableNow=True)
        return writer.trigger(processingTime=f"{config.trigger.interval.ms} milliseconds")
