"""Run one pipeline: checks, Spark query, exactly-once sink, graceful stop.

:func:`run` is the whole life of a runner process:

1. find the connector jars, check both Kafka clusters and topics (seconds,
   before Spark starts, so typos fail fast);
2. start Spark, build the source stream (from G's offsets on a new checkpoint
   generation), apply the transform, choose the commit mode;
3. run the streaming query with the chosen sink in ``foreachBatch``;
4. on SIGTERM (or SIGINT), let the batch in flight commit, then stop; with
   ``trigger.availableNow`` stop when the input is consumed.

Step 2 is six steps in a fixed order (take the ids over, reset G, prepare the
JVM, read G, build the stream, confirm the plan): :mod:`eop_spark.runtime.query_start`.
While the query runs, G's offsets are kept from expiring between batches
(:mod:`eop_spark.exactly_once.keep_alive`).

The speed-ups (:mod:`eop_spark.speedups`) are plugged in here: :data:`ARROW_PATH`
and :data:`TASK_HAND_OFF`; the worker daemon and the class archive by the
session (:mod:`eop_spark.runtime.session`).

SIGUSR1 prints the stack of every thread of the runner to stderr, to see
where a stuck runner waits (Spark's Python workers do the same, see
:mod:`eop_spark.speedups.worker_daemon`; the JVM prints its threads on SIGQUIT).

Exit codes are documented in :mod:`eop_spark.contract.errors`.
"""

from __future__ import annotations

import faulthandler
import functools
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from eop_spark.contract.errors import EXIT_OK, EopError, PipelineFailed, from_failure
from eop_spark.contract.offsets import Offsets, TopicPartition
from eop_spark.contract.progress_names import ProgressNames, progress_names
from eop_spark.contract.redaction import Redactor
from eop_spark.contract.run_config import RunConfig
from eop_spark.contract.termination import failure_line
from eop_spark.exactly_once.coordinated import CoordinatedSink
from eop_spark.exactly_once.cross_cluster import LagView, ProgressTopics
from eop_spark.exactly_once.keep_alive import KeepAlive, refresh_each_partition
from eop_spark.exactly_once.partitioned.task import warm_up_workers
from eop_spark.exactly_once.progress_group import ProgressGroup
from eop_spark.exactly_once.sink_settings import SinkSettings, take_over
from eop_spark.kafka import durability, preflight
from eop_spark.kafka.client_config import (
    read_secret_dir,
    sink_java_config,
    source_client_config,
    without_java_only,
)
from eop_spark.kafka.preflight import cluster_id
from eop_spark.runtime.batch_gate import BatchGate
from eop_spark.runtime.batch_log import configure_logging, log_batch
from eop_spark.runtime.jars import connector_jars
from eop_spark.runtime.metrics import Counters, serve_metrics
from eop_spark.runtime.query_start import QueryStart
from eop_spark.runtime.session import build_session
from eop_spark.speedups.native_produce import NativeProduce
from eop_spark.speedups.producer_hub import HubHandOff

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

#: How often the supervising loop wakes up to look at signals and Spark's batch reports.
POLL_S = 1
#: How long a graceful stop waits for Spark to record the last batch in its commit log.
COMMIT_LOG_WAIT_S = 30

#: The speed-ups this runner plugs into the exactly-once core (see eop_spark.speedups): how
#: the sinks' producers queue Arrow columns, and where a partitioned task may hand its rows
#: over (the executor's producer hub, when its worker daemon started one).
ARROW_PATH = NativeProduce()
TASK_HAND_OFF = HubHandOff()


def secret_redactor(config: RunConfig) -> Redactor:
    """The values of the run's mounted Secrets, to keep out of its termination message
    (which the operator copies into the pipeline's status and events)."""
    values: list[str] = []
    for directory in (config.source_secret_dir, config.sink_secret_dir):
        try:
            values += read_secret_dir(directory).values()
        except (EopError, OSError):
            continue  # unreadable: its error is the failure, with no value in it
    return Redactor(tuple(values))


def report_failure(error: EopError, redactor: Redactor) -> None:
    """Report a failure on stderr and in ``$EOP_TERMINATION_LOG``, Secret values redacted."""
    line = redactor.redact(failure_line(error))
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
        report_failure(error, secret_redactor(config))
        return error.exit_code
    except Exception as exc:
        log.exception("unexpected failure")
        report_failure(from_failure(exc), secret_redactor(config))
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
        #: and G's lag view on the source cluster (see eop_spark.exactly_once.cross_cluster).
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
        source, sink = preflight.check_clusters(source_conf, sink_conf, kafka, config.sink.kafka)
        partitions = preflight.source_partitions(source, kafka.topics, kafka.topic_pattern)
        preflight.sink_partition_count(sink, config.sink.kafka.topic)
        names = self.place_progress(source.id, sink.id, source_conf, sink_conf, partitions)
        self.check_durability(sink_conf, partitions)
        if self.stop.is_set():
            return EXIT_OK
        if config.metrics_port is not None:
            serve_metrics(self.counters, config.pipeline, config.metrics_port)

        progress = ProgressGroup(names, sink_conf)
        settings = self.sink_settings(sink_conf, progress)
        # Taking the ids over waits on the broker (it aborts what a killed runner left open)
        # and needs no Spark: it runs while the JVM starts.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="eop-take-over") as pool:
            taken = pool.submit(take_over, settings, partitions)
            spark = build_session(config, jars)
            # Python workers start while the query is planned.
            threading.Thread(
                target=self._warm_up, args=(spark,), name="eop-warm-up", daemon=True
            ).start()
            query, gate = self.start_query(
                spark, partitions, sink_conf, progress=progress, settings=settings, taken=taken
            )
        keep_alive = self.keep_alive(gate, settings, progress, partitions)
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
        on the source cluster is set up (see :mod:`eop_spark.exactly_once.cross_cluster`).
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

    def check_durability(self, sink_conf: dict[str, str], partitions: list[TopicPartition]) -> None:
        """Refuse (or warn of, per ``sink.kafka.durability``) topics kept in too few copies.

        The sink topic, and G's progress topics when there are any (see
        :mod:`eop_spark.kafka.durability`).
        """
        kafka = self.config.sink.kafka
        topics = {kafka.topic: "sink topic"}
        if self.progress_topics is not None:
            names = self.progress_topics.names
            topics |= {names.topic(t): "progress topic" for t in sorted({t for t, _ in partitions})}
        durability.check_topics(sink_conf, topics, kafka.durability)

    def keep_alive(
        self,
        gate: BatchGate,
        settings: SinkSettings,
        progress: ProgressGroup,
        partitions: list[TopicPartition],
    ) -> KeepAlive:
        """The thread that keeps G's offsets from expiring while this run is idle.

        Between batches, in the commit mode the sink uses at that moment (the
        first batch may switch it): the coordinated sink re-commits under its
        own producer; the partitioned mode re-commits each partition under that
        partition's id (see :mod:`eop_spark.exactly_once.keep_alive`).
        """

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

        return KeepAlive(settings.client_config, gate.between_batches, refresh)

    def _warm_up(self, spark: SparkSession) -> None:
        try:
            warm_up_workers(spark, spark.sparkContext.defaultParallelism)
        except Exception as exc:  # only an optimisation
            log.debug("warming up Python workers failed: %s", exc)

    def sink_settings(self, sink_conf: dict[str, str], progress: ProgressGroup) -> SinkSettings:
        """What every sink transaction of this run needs to know: built once per run.

        Taking the ids over, the sinks and their Spark tasks, and the keep-alive
        all get this one value.
        """
        config = self.config
        return SinkSettings(
            topic=config.sink.kafka.topic,
            client_config=sink_conf,
            transactional_id_prefix=config.transactional_id_prefix,
            transaction_timeout=config.sink.kafka.transaction_timeout,
            progress=progress.names,
            group_metadata=progress.group_metadata(),
            arrow_path=ARROW_PATH,
        )

    def start_query(
        self,
        spark: SparkSession,
        partitions: list[tuple[str, int]],
        sink_conf: dict[str, str],
        *,
        progress: ProgressGroup | None = None,
        settings: SinkSettings | None = None,
        taken: Future[int] | None = None,
    ) -> tuple[StreamingQuery, BatchGate]:
        """Take over the transactional ids (unless ``taken`` does), build the stream, start it.

        Without ``progress`` (an embedder that skips :meth:`run`), where G keeps
        its offsets is asked of the two clusters here (:meth:`place_progress`);
        without ``settings`` (:meth:`sink_settings` of ``progress``) they are built here.
        The steps and their order: :mod:`eop_spark.runtime.query_start`.
        """
        config = self.config
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
        start = QueryStart(
            config,
            spark,
            partitions,
            sink_conf,
            self.sink_properties,
            progress,
            settings or self.sink_settings(sink_conf, progress),
            self.counters,
            hand_off=TASK_HAND_OFF,
            progress_topics=self.progress_topics,
            lag_view=self.lag_view,
        )
        return start.run(taken)

    def supervise(self, query: StreamingQuery, gate: BatchGate) -> int:
        """Wait for the query to end or a stop request; log each batch; return the exit code."""
        reports = _BatchReports(query)
        stopping = False
        error: BaseException | None = None
        while True:
            if self.stop.is_set() and not stopping:
                stopping = True
                gate.close()
            if stopping and gate.idle.is_set():
                await_commit_log(query, gate.last_completed)
                query.stop()
                break
            try:
                if query.awaitTermination(POLL_S):
                    break
            except Exception as exc:
                error = exc
                break
            self.emit(gate, reports, final=False)
        self.emit(gate, reports, final=True)
        if isinstance(gate.sink, CoordinatedSink):
            gate.sink.close()
        if gate.failure is not None:
            raise gate.failure
        if error is not None and not stopping:
            raise PipelineFailed(f"the streaming query failed: {from_failure(error).message}")
        log.info("stopped" if stopping else "the query finished (trigger availableNow)")
        return EXIT_OK

    def emit(self, gate: BatchGate, reports: _BatchReports, *, final: bool) -> None:
        """Log the finished batches, with their input row counts once Spark reported them."""
        pending = gate.take_results()
        if not pending:
            return
        rows_in, last_reported = reports.rows_in({r.batch_id for r in pending}, exhaustive=final)
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


def await_commit_log(query: StreamingQuery, batch_id: int | None) -> None:
    """Wait until Spark has recorded ``batch_id`` in its commit log (or the query ended).

    The sink's work ends when ``foreachBatch`` returns; Spark writes the batch to
    its checkpoint's commit log after that, then reports the batch's progress.
    Stopping the query in between leaves the batch to run again at the next start
    (where the sink finds it committed and writes nothing), so a graceful stop
    waits for the report. Bounded: a stop must end even if Spark never reports.
    """
    if batch_id is None:
        return
    deadline = time.monotonic() + COMMIT_LOG_WAIT_S
    while query.isActive and time.monotonic() < deadline:
        last = query.lastProgress
        if last is not None and int(last["batchId"]) >= batch_id:
            return
        time.sleep(0.05)
    if query.isActive:
        log.warning(
            "Spark did not record batch %d in its commit log within %ss of the stop: "
            "the next run finds it committed and writes nothing for it",
            batch_id,
            COMMIT_LOG_WAIT_S,
        )


class _BatchReports:
    """Input row counts per batch, from Spark's batch reports (its ``StreamingQueryProgress``)."""

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
