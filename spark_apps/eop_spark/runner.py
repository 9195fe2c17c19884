"""Run one pipeline: checks, Spark query, exactly-once sink, graceful stop.

:func:`run` is the whole life of a runner process:

1. find the connector jars, check both Kafka clusters and topics (seconds,
   before Spark starts, so typos fail fast);
2. start Spark, build the source stream (from G's offsets on a new checkpoint
   generation), apply the transform, choose the commit mode;
3. run the streaming query with the chosen sink in ``foreachBatch``;
4. on SIGTERM (or SIGINT), let the batch in flight commit, then stop; with
   ``trigger.availableNow`` stop when the input is consumed.

SIGUSR1 prints the stack of every thread of the runner to stderr, to see
where a stuck runner waits (Spark's Python workers do the same, see
:mod:`eop_spark.worker_daemon`; the JVM prints its threads on SIGQUIT).

Exit codes are documented in :mod:`eop_spark.errors`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from eop_spark import preflight
from eop_spark.allocator import keep_freed_memory
from eop_spark.batch_log import BatchResult, configure_logging, log_batch
from eop_spark.client_config import sink_java_config, source_client_config, without_java_only
from eop_spark.config import RunConfig
from eop_spark.cross_cluster import LagView, ProgressTopics
from eop_spark.errors import EXIT_OK, ConfigError, EopError, PipelineFailed, from_failure
from eop_spark.generations import (
    check_checkpoint_kept,
    check_state_kept,
    check_state_store_reachable,
)
from eop_spark.jars import connector_jars
from eop_spark.keep_alive import KeepAlive, refresh_each_partition
from eop_spark.metrics import Counters, serve_metrics
from eop_spark.offsets import Offsets, TopicPartition
from eop_spark.offsets_log import HadoopFiles, LocalFiles, OffsetsLog, is_local
from eop_spark.plan import ModeChoice, choose_mode, logical_blockers, physical_blockers
from eop_spark.progress import ProgressGroup, cluster_id
from eop_spark.progress_names import ProgressNames, progress_names
from eop_spark.reasons import failure_line
from eop_spark.reset import reset_for_stateless_generation
from eop_spark.session import build_session
from eop_spark.sink_coordinated import CoordinatedSink, bounded_batches
from eop_spark.sink_partitioned import JvmTasks, PartitionedSink, warm_up_workers
from eop_spark.sink_settings import SinkSettings, take_over
from eop_spark.source import read_kafka, resolve_starting_offsets
from eop_spark.spec import CommitMode
from eop_spark.transform import Transformed, apply_transform

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("eop_spark.runner")

Sink = PartitionedSink | CoordinatedSink

#: How often the supervising loop wakes up to look at signals and progress.
POLL_S = 1


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


def _report_failure(error: EopError) -> None:
    line = failure_line(error)
    print(line, file=sys.stderr, flush=True)
    path = os.environ.get("EOP_TERMINATION_LOG")
    if path:
        try:
            with open(path, "w") as termination_log:
                termination_log.write(line + "\n")
        except OSError as exc:
            log.warning("cannot write the termination log %s: %s", path, exc)


def run(config: RunConfig, *, log_format: str = "text") -> int:
    """Run the pipeline until stopped; return the process exit code."""
    configure_logging(log_format)
    stop = threading.Event()
    _install_signal_handlers(stop)
    try:
        return PipelineRun(config, stop).run()
    except EopError as error:
        _report_failure(error)
        return error.exit_code
    except Exception as exc:
        log.exception("unexpected failure")
        _report_failure(from_failure(exc))
        return 1


def _install_signal_handlers(stop: threading.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # embedded (tests, benchmarks): the caller stops the run

    def handler(signum: int, _frame: Any) -> None:
        log.info("received %s: stopping after the batch in flight", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    faulthandler.register(signal.SIGUSR1, all_threads=True)


class PipelineRun:
    """One run of a pipeline: :meth:`run` is the whole life cycle.

    Embedders (the benchmark) that bring their own SparkSession call
    :meth:`start_query` and wait on the query themselves.
    """

    def __init__(self, config: RunConfig, stop: threading.Event) -> None:
        """``stop`` asks a running :meth:`run` to stop after the batch in flight."""
        self.config = config
        self.stop = stop
        self.counters = Counters()
        #: Source and sink on different clusters: G's progress topics on the sink cluster,
        #: and G's lag view on the source cluster (see eop_spark.cross_cluster).
        self.progress_topics: ProgressTopics | None = None
        self.lag_view: LagView | None = None

    @functools.cached_property
    def sink_properties(self) -> dict[str, str]:
        """Every sink client property (``sink_java_config``), its Secret read once per run.

        The librdkafka clients get them without the Java-only ones
        (``sink_client_config``), the JVM writer all of them: both from one
        reading, so a Secret updated meanwhile cannot give them different logins.
        """
        return sink_java_config(self.config)

    def run(self) -> int:
        """Check, start Spark and the query, supervise it; return the exit code."""
        config = self.config
        jars = connector_jars()
        source_conf = source_client_config(config)
        sink_conf = without_java_only(self.sink_properties)
        kafka = config.source.kafka
        source = preflight.cluster(source_conf, "source")
        sink = preflight.cluster(sink_conf, "sink")
        partitions = preflight.source_partitions(source, kafka.topics, kafka.topic_pattern)
        preflight.sink_partition_count(sink, config.sink.kafka.topic)
        names = self.place_progress(source.id, sink.id, source_conf, sink_conf, partitions)
        if self.stop.is_set():
            return EXIT_OK
        if config.metrics_port is not None:
            serve_metrics(self.counters, config.pipeline, config.metrics_port)

        progress = ProgressGroup(names, sink_conf)
        # Taking the ids over waits on the broker (it aborts what a killed runner left open)
        # and needs no Spark: it runs while the JVM starts.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="eop-take-over") as pool:
            taken = pool.submit(take_over, self.sink_settings(sink_conf, progress), partitions)
            spark = build_session(config, jars)
            # Python workers start while the query is planned.
            threading.Thread(
                target=self._warm_up, args=(spark,), name="eop-warm-up", daemon=True
            ).start()
            query, gate = self.start_query(
                spark, partitions, sink_conf, progress=progress, taken=taken
            )
        keep_alive = self.keep_alive(gate, sink_conf, progress, partitions)
        keep_alive.start()
        try:
            return self.supervise(query, gate)
        finally:
            keep_alive.stop()
            if self.lag_view is not None:
                self.lag_view.close()

    def place_progress(
        self,
        source_cluster: str | None,
        sink_cluster: str | None,
        source_conf: dict[str, str],
        sink_conf: dict[str, str],
        partitions: list[TopicPartition],
    ) -> ProgressNames:
        """Where G keeps its offsets, from the clusters' ids; progress topics made if needed.

        Source and sink on different clusters: G's progress topics are created
        (or grown) on the sink cluster now, before any output, and G's lag view
        on the source cluster is set up (see :mod:`eop_spark.cross_cluster`).
        """
        config = self.config
        names = progress_names(config.progress_group, source_cluster, sink_cluster)
        if names.progress_topics:
            self.progress_topics = ProgressTopics(names, sink_conf, config.sink.kafka.topic)
            self.progress_topics.cover(partitions)
            self.lag_view = LagView(names.group, source_conf)
            self.lag_view.start()
            log.info(
                "source and sink are different Kafka clusters: %s; its lag view is group %s "
                "on the source cluster",
                names.where(),
                names.group,
            )
        return names

    def keep_alive(
        self,
        gate: BatchGate,
        sink_conf: dict[str, str],
        progress: ProgressGroup,
        partitions: list[TopicPartition],
    ) -> KeepAlive:
        """The thread that keeps G's offsets from expiring while this run is idle.

        Between batches, in the commit mode the sink uses at that moment (the
        first batch may switch it): the coordinated sink re-commits under its
        own producer; the partitioned mode re-commits each partition under that
        partition's id (see :mod:`eop_spark.keep_alive`).
        """
        settings = self.sink_settings(sink_conf, progress)

        def refresh() -> Offsets:
            sink = gate.sink
            # The partitions found at start, and any a topic pattern added since.
            batches = sink.offsets_log.batches()
            latest = sink.offsets_log.end_offsets(batches[-1]) if batches else {}
            current = sorted(set(partitions) | set(latest))
            if isinstance(sink, CoordinatedSink):
                refreshed = sink.refresh_progress(current)
            else:
                refreshed = refresh_each_partition(settings, progress, current)
            if self.lag_view is not None:  # it expires on the source cluster likewise
                self.lag_view.publish(refreshed)
            return refreshed

        return KeepAlive(sink_conf, gate.between_batches, refresh)

    def _warm_up(self, spark: SparkSession) -> None:
        try:
            warm_up_workers(spark, spark.sparkContext.defaultParallelism)
        except Exception as exc:  # only an optimisation
            log.debug("warming up Python workers failed: %s", exc)

    def sink_settings(self, sink_conf: dict[str, str], progress: ProgressGroup) -> SinkSettings:
        """What every sink transaction of this run needs to know."""
        config = self.config
        return SinkSettings(
            topic=config.sink.kafka.topic,
            client_config=sink_conf,
            transactional_id_prefix=config.transactional_id_prefix,
            transaction_timeout=config.sink.kafka.transaction_timeout,
            progress=progress.names,
            group_metadata=progress.group_metadata(),
        )

    def start_query(
        self,
        spark: SparkSession,
        partitions: list[tuple[str, int]],
        sink_conf: dict[str, str],
        *,
        progress: ProgressGroup | None = None,
        taken: Future[int] | None = None,
    ) -> tuple[StreamingQuery, BatchGate]:
        """Take over the transactional ids (unless ``taken`` does), build the stream, start it.

        Without ``progress`` (an embedder that skips :meth:`run`), where G keeps
        its offsets is asked of the two clusters here (:meth:`place_progress`).
        """
        config = self.config
        files = LocalFiles() if is_local(config.checkpoint_location) else HadoopFiles(spark)
        offsets_log = OffsetsLog(config.checkpoint_location, files)
        if progress is None:
            source_conf = source_client_config(config)
            names = self.place_progress(
                cluster_id(source_conf, "source"),
                cluster_id(sink_conf, "sink"),
                source_conf,
                sink_conf,
                partitions,
            )
            progress = ProgressGroup(names, sink_conf)
        settings = self.sink_settings(sink_conf, progress)
        # Before reading G: aborts what a crashed or zombie runner left open.
        count = taken.result() if taken is not None else take_over(settings, partitions)
        log.info("took over %d transactional ids %s.*", count, config.transactional_id_prefix)
        if offsets_log.is_new():
            # Before anything acts on an empty checkpoint (a stateless generation's reset).
            check_checkpoint_kept(config, offsets_log.files)
        reset_for_stateless_generation(config, offsets_log, partitions, sink_conf, progress.names)
        if self.lag_view is not None:  # G as this run finds it (a killed run may not have told)
            self.lag_view.publish(progress.committed(partitions))
        run = uuid.uuid4().hex
        jvm = self.jvm_tasks(spark, settings, run, partitions)
        start = resolve_starting_offsets(config, offsets_log, progress, partitions)
        log.info("%s", start.why)
        df = read_kafka(spark, config, start.offsets)
        transformed = apply_transform(spark, df, config.transform)
        analyzed = str(transformed.df._jdf.queryExecution().analyzed().toString())
        check_state_kept(config, analyzed, start.resumes_progress)
        check_state_store_reachable(config, analyzed)
        choice = self.choose(transformed, analyzed)
        log.info("commit mode %s: %s", choice.mode.value, choice.reason)

        topics = self.progress_topics
        coordinated = CoordinatedSink(
            settings, offsets_log, transformed.layout, progress, progress_topics=topics
        )
        sink: Sink = coordinated
        if choice.mode == CommitMode.PARTITIONED:
            sink = PartitionedSink(
                settings, offsets_log, transformed.layout, jvm, run, progress_topics=topics
            )
        else:
            if jvm is not None:
                jvm.release()
            keep_freed_memory()  # this process moves every record (the workers do it themselves)
            if (bounded := bounded_batches(config)) is not config:  # a batch is a transaction
                bound = bounded.source.kafka.max_offsets_per_trigger
                log.info("batches read at most %s records (sink.kafka.transactionTimeout)", bound)
                df = read_kafka(spark, bounded, start.offsets)
                transformed = apply_transform(spark, df, config.transform)
        started: list[StreamingQuery] = []
        ready = threading.Event()

        def confirm_plan(current: Sink) -> Sink:
            # The physical plan exists only once a batch is planned: check it at the first one.
            if not isinstance(current, PartitionedSink) or not ready.wait(60):
                return current
            plan = started[0]._jsq.streamingQuery().lastExecution().executedPlan().toString()
            blockers = physical_blockers(str(plan))
            if not blockers:
                return current
            problem = f"the physical plan has {', '.join(blockers)}"
            if config.sink.kafka.commit_mode == CommitMode.PARTITIONED:
                raise ConfigError(f"commitMode partitioned is not possible: {problem}")
            log.warning("commit mode coordinated after all: %s", problem)
            if jvm is not None:
                jvm.release()
            return coordinated

        after_batch = self._publish_lag if self.lag_view is not None else None
        gate = BatchGate(sink, self.counters, confirm_plan, after_batch)
        try:
            started.append(self.writer(transformed.df, gate).start())
        except Exception as exc:
            raise ConfigError(f"the query cannot start: {from_failure(exc).message}") from exc
        ready.set()
        return started[0], gate

    def _publish_lag(self, result: BatchResult) -> None:
        """Note a completed batch's end offsets for the lag view (its thread commits them)."""
        if self.lag_view is not None:
            self.lag_view.publish(result.offsets)

    def jvm_tasks(
        self,
        spark: SparkSession,
        settings: SinkSettings,
        run: str,
        partitions: list[tuple[str, int]],
    ) -> JvmTasks | None:
        """Where partitioned tasks of ``run`` would commit (None: in Python workers).

        In local mode the JVM starts their first steps at once, while the query
        is planned and started (taking the ids, reading G): call it after the
        take-over and any reset of G.
        """
        if self.config.sink.kafka.commit_mode == CommitMode.COORDINATED:
            return None
        jvm = JvmTasks.decide(spark, settings, self.sink_properties, run, partitions)
        if jvm is not None:
            jvm.prepare(spark, partitions)
        return jvm

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
        return writer.trigger(processingTime=f"{config.trigger.interval_ms()} milliseconds")

    def choose(self, transformed: Transformed, analyzed: str) -> ModeChoice:
        """The commit mode for the query with the analysed plan ``analyzed`` (``choose_mode``)."""
        return choose_mode(
            self.config.sink.kafka.commit_mode,
            logical_blockers(analyzed),
            transformed.provenance,
            transformed.provenance_reason,
        )

    def supervise(self, query: StreamingQuery, gate: BatchGate) -> int:
        """Wait for the query to end or a stop request; log each batch; return the exit code."""
        progress = _ProgressReader(query)
        stopping = False
        error: BaseException | None = None
        while True:
            if self.stop.is_set() and not stopping:
                stopping = True
                gate.close()
            if stopping and gate.idle.is_set():
                query.stop()
                break
            try:
                if query.awaitTermination(POLL_S):
                    break
            except Exception as exc:
                error = exc
                break
            self.emit(gate, progress, final=False)
        self.emit(gate, progress, final=True)
        if isinstance(gate.sink, CoordinatedSink):
            gate.sink.close()
        if gate.failure is not None:
            raise gate.failure
        if error is not None and not stopping:
            raise PipelineFailed(f"the streaming query failed: {from_failure(error).message}")
        log.info("stopped" if stopping else "the query finished (trigger availableNow)")
        return EXIT_OK

    def emit(self, gate: BatchGate, progress: _ProgressReader, *, final: bool) -> None:
        """Log the finished batches, with their input row counts once Spark reported them."""
        pending = gate.take_results()
        if not pending:
            return
        rows_in, last_reported = progress.rows_in({r.batch_id for r in pending}, exhaustive=final)
        waiting = []
        for result in pending:
            reported = result.batch_id in rows_in
            # A batch older than the last report that no report mentions will never get one.
            if reported or final or result.batch_id < last_reported:
                result.rows_in = rows_in.get(result.batch_id)
                if result.rows_in is not None:
                    self.counters.add_rows_in(result.rows_in)
                log_batch(log, result)
            else:
                waiting.append(result)
        gate.put_back(waiting)


class _ProgressReader:
    """Input row counts per batch, from the query's progress reports."""

    def __init__(self, query: StreamingQuery) -> None:
        self.query = query

    def rows_in(self, batch_ids: set[int], *, exhaustive: bool) -> tuple[dict[int, int], int]:
        """``numInputRows`` of the ``batch_ids`` Spark reported, and the last reported batch id."""
        last = self.query.lastProgress
        last_id = int(last["batchId"]) if last else -1
        reports = [last] if last else []
        if exhaustive or min(batch_ids) < last_id:
            reports = list(self.query.recentProgress)
        found: dict[int, int] = {}
        for report in reports:
            # Idle triggers report the next batch id with no addBatch: not a batch.
            if report["batchId"] in batch_ids and "addBatch" in report.get("durationMs", {}):
                found[report["batchId"]] = report["numInputRows"]
        return found, last_id
