"""The partitioned commit mode's task: one transaction per source partition, in a Spark task.

For record-wise queries each Spark task of a micro-batch reads exactly one
source topic-partition ``(t, p)`` range ``[from, until)`` (``until`` from the
checkpoint's ``offsets/N``, which the driver hands to the batch's tasks as the
Spark local property :data:`BATCH_PROPERTY`).  The task, with the
transactional producer ``<prefix>.<t>.<p>``:

1. makes sure the producer holds the id (``init_transactions`` when built:
   fences every older holder and aborts its open transaction);
2. reads ``c``, G's stable committed offset for ``(t, p)`` (unless it knows
   it, see below);
3. skips if ``c >= until`` (the range is visible already: a replay);
4. else begins, adds ``{(t, p): until}`` for G to the transaction *first*
   (a producer fenced since its last use fails here, before any row is
   consumed, and is rebuilt), produces the rows with offset ``>= c``, commits.
   When the rows it was given end before ``until - 1`` it adds G at the offset
   after its last row instead, before committing: an input that ends does not
   say the range did (see ``_OpenTransaction.close_short``).

A range that takes longer than a third of the transaction timeout to write
is committed in several transactions (invariant 10): once the open one has
lived that long, the task commits it at the next row of a higher source
offset, with G at the offset after the last row it produced, and begins the
next (its offsets first again).  A replay then produces the rows from there
on: each transaction still moves G over exactly the rows it made visible.
The clock is read once per Arrow batch (per :data:`ROWS_PER_CLOCK_CHECK`
rows in the JVM); rows the transform filtered out never reach the task and
are covered by the next commit's G.

Reading ``c`` after the producer obtained its epoch is what makes this safe:
a commit succeeds only if nobody initialised the id since, so nobody can have
moved G in between.  For the same reason a producer that committed ``(t, p)``
in this run knows ``c`` without asking: it is the ``until`` of its own last
commit, as long as nobody initialised the id since, which the next commit
proves or refutes (fenced: rebuild, read ``c``); a skip needs no proof, as G
only moves forward within a run.  Any failure forgets what it knew.

A task whose rows were all filtered out has nothing to tell it its
partition, partitions with an empty range get no task at all, and a task
may leave G short of ``until``: after the job succeeded the driver runs the
same steps, with the same transactional id and no rows, for every partition
no task brought to ``until``.  So after every completed
batch G equals the batch's end offsets (invariant 5).

This module runs these steps in a Python process (:func:`commit_partition`,
with librdkafka producers kept per process and transactional id): a Spark
Python worker, the executor's producer hub (a :class:`TaskHandOff` the runner
plugs in), or the driver.  By default the tasks run them in the executor's JVM
instead (``PartitionedWriter.java``); which path runs when, and why each
exists, is the table in :mod:`eop_spark.exactly_once.partitioned`.

Longer than most modules: the four steps, the split of a long range into
several transactions and the checks on a task's rows are one protocol, which
``PartitionedWriter.java`` implements again in Java; each is read against the
other, so they stay in one file each.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any, Protocol

from eop_spark.contract.errors import PipelineFailed, ProducerFenced, after_transaction
from eop_spark.contract.offsets import Offsets, TopicPartition
from eop_spark.exactly_once.batch_markers import marker_batch
from eop_spark.exactly_once.batch_result import BatchStatus
from eop_spark.exactly_once.progress_group import ProgressGroup
from eop_spark.exactly_once.sink_contract import (
    PROVENANCE_COLUMNS,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    OutputLayout,
    produce_arrow_batch,
)
from eop_spark.exactly_once.sink_settings import SinkSettings
from eop_spark.kafka.transactional_producer import TransactionalProducer

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: One row per task that saw rows (and per partition the driver advanced).
# Integers as long: Arrow infers int64 from Python ints.
STATS_SCHEMA = (
    "topic string, partition long, status string, rows_out long, txn_ms double, "
    "fenced long, aborted long, short boolean"
)

#: The Spark local property that brings a batch's end offsets and marker to its tasks.
#: Spark sends a job's local properties along with each of its tasks, so the task function
#: is pickled and registered with the JVM once per run instead of once per batch.  Only
#: offsets and the marker go there (local properties are written to Spark's event log).
BATCH_PROPERTY = "eop.partitioned.batch"
#: The local property Spark itself gives every job of a streaming batch.
SPARK_BATCH_PROPERTY = "streaming.sql.batchId"
#: A task's transaction lives at most this share of the transaction timeout before the task
#: commits what it produced and begins the next (the broker aborts it at the timeout).
TIMEOUT_SHARE = 3
#: In the JVM writer, rows between two looks at the clock (its ROWS_PER_CLOCK_CHECK).
ROWS_PER_CLOCK_CHECK = 1024
#: Appended to the batch's marker for an intermediate commit, so that G short of the batch
#: end is never taken for the batch done (see offsets.marked_batch).
PARTIAL_SUFFIX = ":partial"


@dataclass(frozen=True)
class PartitionOutcome:
    """What one partition's share of a batch came to."""

    topic: str
    partition: int
    status: str  # committed | skipped
    rows_out: int
    txn_ms: float
    fenced: int
    aborted: int
    #: G was left short of the batch end: the task's input ended before its last offset
    #: (rows filtered out, transaction markers, or an upstream failure that Spark's Python
    #: runner ends as a clean end of input).  The driver tops it up once the job succeeded.
    short: bool = False


class TaskHandOff(Protocol):
    """Another process of the executor that may commit a task's partition: the producer hub.

    Plain data (pickled into the task function); the runner plugs one in
    (:class:`eop_spark.speedups.producer_hub.HubHandOff`).  Without one, every
    task commits in the process that runs it.
    """

    def commit(
        self,
        task: PartitionTask,
        tp: TopicPartition,
        first: pa.RecordBatch,
        batches: Iterable[pa.RecordBatch],
    ) -> PartitionOutcome | None:
        """Commit ``tp``'s rows there (``batches``, ``first`` first); None: commit them here."""
        ...

    def note_holder(self, transactional_id: str) -> None:
        """Note that this process holds ``transactional_id`` now (it just built its producer)."""
        ...

    def taken_over_here(self, transactional_id: str) -> bool:
        """Whether another process of this executor took ``transactional_id`` from this one.

        Such a fencing is Spark's scheduling, not another runner of the pipeline.
        """
        ...


@dataclass(frozen=True)
class PartitionTask:
    """Everything a Spark task needs for its partition (pickled into the task)."""

    sink: SinkSettings
    end_offsets: Offsets
    layout: OutputLayout
    marker: str
    #: This run of the sink: what a producer knows of G holds within one run only
    #: (a stateless restart resets G before its run, in the same process in tests).
    run: str
    #: Where else in the executor the task may commit (None: only in its own process).
    hand_off: TaskHandOff | None = None

    @property
    def topic(self) -> str | None:
        """The batch's one source topic, or None when it reads several."""
        topics = {topic for topic, _ in self.end_offsets}
        return topics.pop() if len(topics) == 1 else None

    def provenance(self) -> tuple[str, ...]:
        """The provenance columns the task's rows carry.

        With one source topic the topic column is left out: it is the same
        string in every row, and writing it into Arrow and checking it cost
        ~5 % of partitioned mode's throughput at 100-byte records.
        """
        if self.topic is None:
            return PROVENANCE_COLUMNS
        return tuple(c for c in PROVENANCE_COLUMNS if c != SOURCE_TOPIC)


def encode_batch(end_offsets: Offsets, marker: str) -> str:
    """The value of :data:`BATCH_PROPERTY` for a batch."""
    return json.dumps({"marker": marker, "end": [[t, p, o] for (t, p), o in end_offsets.items()]})


def decode_batch(value: str | None, spark_batch: str | None = None) -> tuple[Offsets, str]:
    """``(end_offsets, marker)`` from :data:`BATCH_PROPERTY`.

    Fails when the property is missing, or its marker names another batch
    than Spark's own ``spark_batch`` (:data:`SPARK_BATCH_PROPERTY`) of the
    task's job: a task commits G to its batch's end offsets, never to another
    batch's.
    """
    if not value:
        raise PipelineFailed(
            f"a partitioned task found no {BATCH_PROPERTY} property: it runs outside the "
            "batch job that the partitioned sink starts"
        )
    data = json.loads(value)
    marker = str(data["marker"])
    if spark_batch is not None and marker_batch(marker) != spark_batch:
        raise PipelineFailed(
            f"a partitioned task of batch {spark_batch} was given the offsets of batch "
            f"{marker_batch(marker)}: nothing is committed"
        )
    return {(str(t), int(p)): int(o) for t, p, o in data["end"]}, marker


@dataclass(frozen=True)
class TaskFunction:
    """What every task of a run shares (pickled into the task function once per run)."""

    sink: SinkSettings
    layout: OutputLayout
    run: str
    hand_off: TaskHandOff | None = None

    def task(self, batch_property: str | None, spark_batch: str | None = None) -> PartitionTask:
        """This batch's :class:`PartitionTask`, from the job's :data:`BATCH_PROPERTY`."""
        end_offsets, marker = decode_batch(batch_property, spark_batch)
        return PartitionTask(self.sink, end_offsets, self.layout, marker, self.run, self.hand_off)


# Per-process caches: the producer hub (or a Spark Python worker) serves many tasks and
# batches, and building a producer (connect, init_transactions) costs more than a small
# batch.  The hub serves tasks on threads, one at a time per transactional id.
_producers: dict[tuple[str, str], TransactionalProducer] = {}
_groups: dict[str, ProgressGroup] = {}
_groups_lock = threading.Lock()


def _fingerprint(conf: dict[str, Any]) -> str:
    return hashlib.sha256(repr(sorted(conf.items())).encode()).hexdigest()


def _progress_group(sink: SinkSettings) -> ProgressGroup:
    key = _fingerprint({**sink.client_config, "progress": repr(sink.progress)})
    with _groups_lock:
        if key not in _groups:
            _groups[key] = ProgressGroup(sink.progress, sink.client_config)
        return _groups[key]


def _producer(task: PartitionTask, tp: TopicPartition, fresh: bool) -> TransactionalProducer:
    sink, hand_off = task.sink, task.hand_off
    conf = sink.producer_config(tp)
    key = (sink.transactional_id(tp), _fingerprint(conf))
    cached = _producers.get(key)
    # Another process of this executor built a producer for the id since: this one is
    # fenced, and finding out from the broker would cost a round trip.
    taken = hand_off is not None and hand_off.taken_over_here(key[0])
    if cached is not None and (fresh or not cached.usable or taken):
        cached.close()
        del _producers[key]
        cached = None
    if cached is None:
        cached = _producers[key] = sink.record_producer(conf)
        if hand_off is not None:
            hand_off.note_holder(key[0])
    return cached


def _discard(sink: SinkSettings, tp: TopicPartition) -> None:
    for key in [k for k in list(_producers) if k[0] == sink.transactional_id(tp)]:
        _producers.pop(key).close()


def commit_partition(
    task: PartitionTask,
    tp: TopicPartition,
    batches: Iterable[pa.RecordBatch],
) -> PartitionOutcome:
    """Produce ``tp``'s rows not yet in G and move G to ``until``, in one transaction.

    ``batches`` are Arrow record batches of the output columns plus the
    provenance columns, all from ``tp``; empty for an offsets-only commit (the
    driver's, once the job succeeded), which moves G to ``until``.  Rows that
    end before ``until - 1`` move G only to the offset after the last of them
    (the outcome is ``short``).
    """
    sink, until = task.sink, task.end_offsets[tp]
    fenced = 0
    for attempt in range(3):
        producer = _producer(task, tp, fresh=attempt > 0)
        # Taken out: only a commit (or a skip) below puts it back.
        committed = producer.known_progress.pop(task.run, None)
        if committed is None:
            committed = _progress_group(sink).committed([tp]).get(tp, -1)
        if committed >= until:
            producer.known_progress[task.run] = committed
            _drain(batches)
            return PartitionOutcome(tp[0], tp[1], BatchStatus.SKIPPED, 0, 0.0, fenced, 0)
        started = time.monotonic()
        try:
            producer.begin()
            # Offsets first: a producer fenced since its last use fails right here.
            producer.send_offsets(
                {tp: until}, sink.group_metadata, task.marker, names=sink.progress
            )
        except ProducerFenced:
            hand_off = task.hand_off
            if hand_off is None or not hand_off.taken_over_here(sink.transactional_id(tp)):
                fenced += 1  # not the executor's hub or another of its workers: another runner
            continue
        except BaseException:
            producer.abort()
            raise
        open_txn = _OpenTransaction(task, tp, committed, started)
        try:
            rows_out = _produce(producer, open_txn, batches)
            reached = open_txn.close_short(producer)
            producer.commit()
            producer.known_progress[task.run] = reached
        except BaseException as exc:
            aborted = producer.abort()
            if not producer.usable:
                _discard(sink, tp)
            log.warning("transaction of %s aborted=%s", sink.transactional_id(tp), aborted)
            what = f"the transaction of {sink.transactional_id(tp)}"
            error = after_transaction(
                exc, what, time.monotonic() - open_txn.opened_at, open_txn.timeout_ms
            )
            if error is exc:
                raise
            raise error from exc
        if open_txn.transactions > 1:
            log.info(
                "%s: %d rows in %d transactions",
                sink.transactional_id(tp),
                rows_out,
                open_txn.transactions,
            )
        txn_ms = (time.monotonic() - started) * 1000.0
        return PartitionOutcome(
            tp[0], tp[1], BatchStatus.COMMITTED, rows_out, txn_ms, fenced, 0, reached < until
        )
    raise ProducerFenced(
        f"transactional id {sink.transactional_id(tp)!r} keeps being fenced: "
        "another runner of this pipeline is writing"
    )


def _quiet_worker() -> None:
    """Keep a known pyspark-vs-pandas version warning out of the worker's output."""
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"pyspark\..*")


def _drain(batches: Iterable[Any]) -> None:
    for _ in batches:
        pass


class _OpenTransaction:
    """A task's transactions: G so far, the last offset produced, when the open one began."""

    def __init__(self, task: PartitionTask, tp: TopicPartition, committed: int, at: float) -> None:
        self.task = task
        self.tp = tp
        #: Rows below this offset are visible already (G, then each intermediate commit).
        self.floor = committed
        #: Whether an intermediate commit moved G (then no row may come below it).
        self.moved = False
        self.last = -1
        #: The highest source offset among the rows the task was given (produced or not).
        self.seen = -1
        self.transactions = 1
        self.opened_at = at
        self.timeout_ms = task.sink.transaction_timeout.ms
        self.commit_after_s = self.timeout_ms / 1000.0 / TIMEOUT_SHARE

    def close_short(self, producer: TransactionalProducer) -> int:
        """G where the open transaction leaves it: after the last row seen, at most ``until``.

        The input ending says nothing of why it ended: in a Python worker an
        upstream failure (a poison record, a fetch timeout) after some Arrow
        batches were sent reads as a clean end of input.  So G moves only over
        the rows the task saw; when that is short of ``until``, the offsets
        added first are replaced (the last ones added commit) under a partial
        marker, and the driver tops G up to ``until`` once the job succeeded.
        """
        tp, until = self.tp, self.task.end_offsets[self.tp]
        reached = max(self.floor, self.seen + 1)
        if self.seen < 0 or reached >= until:  # no rows: the driver's offsets-only commit
            return until
        sink = self.task.sink
        producer.send_offsets(
            {tp: reached},
            sink.group_metadata,
            self.task.marker + PARTIAL_SUFFIX,
            names=sink.progress,
        )
        return reached

    def overdue(self) -> bool:
        """Whether the open transaction has lived its share of the timeout."""
        return time.monotonic() - self.opened_at >= self.commit_after_s

    def commit_so_far(self, producer: TransactionalProducer) -> None:
        """Commit the rows produced so far, G after the last one; begin the next transaction."""
        sink, tp, marker = self.task.sink, self.tp, self.task.marker
        # The last offsets added for a partition in a transaction are the ones it commits.
        producer.send_offsets(
            {tp: self.last + 1}, sink.group_metadata, marker + PARTIAL_SUFFIX, names=sink.progress
        )
        producer.commit()
        self.floor, self.moved = self.last + 1, True
        self.transactions += 1
        self.opened_at = time.monotonic()
        producer.begin()
        producer.send_offsets(
            {tp: self.task.end_offsets[tp]}, sink.group_metadata, marker, names=sink.progress
        )


def _produce(
    producer: TransactionalProducer,
    txn: _OpenTransaction,
    batches: Iterable[pa.RecordBatch],
) -> int:
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    task, tp = txn.task, txn.tp
    rows_out = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        _check_single_partition(batch, tp)
        offsets = batch.column(SOURCE_OFFSET)
        lowest = pc.min(offsets).as_py()
        txn.seen = max(txn.seen, pc.max(offsets).as_py())
        if lowest < txn.floor:
            if txn.moved:
                raise PipelineFailed(
                    "partitioned commit mode needs each task's rows in source offset order, "
                    f"but a row of {tp} at offset {lowest} came after offset {txn.floor}; "
                    "use commitMode coordinated for this query"
                )
            # Part of this range is visible already (e.g. a writer with other batch bounds).
            batch = batch.filter(pc.greater_equal(offsets, txn.floor))
            if batch.num_rows == 0:
                continue
            offsets = batch.column(SOURCE_OFFSET)
            lowest = pc.min(offsets).as_py()
        # Only between two source offsets: the output rows of one record stay together.
        if 0 <= txn.last < lowest and txn.overdue():
            txn.commit_so_far(producer)
        rows_out += produce_arrow_batch(producer, task.sink.topic, batch, task.layout)
        txn.last = max(txn.last, pc.max(offsets).as_py())
    return rows_out


def _check_single_partition(batch: pa.RecordBatch, tp: TopicPartition) -> None:
    import pyarrow.compute as pc

    topics = [tp[0]]
    if SOURCE_TOPIC in batch.schema.names:
        topics = pc.unique(batch.column(SOURCE_TOPIC)).to_pylist()
    partitions = pc.unique(batch.column(SOURCE_PARTITION)).to_pylist()
    if topics != [tp[0]] or partitions != [tp[1]]:
        raise PipelineFailed(
            "partitioned commit mode needs one source partition per Spark task, but a task "
            f"got rows of {topics} / {partitions}; use commitMode coordinated for this query"
        )


def write_partition(
    function: TaskFunction, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The Spark task body (``mapInArrow``): commit this task's partition, yield its outcome."""
    import pyarrow as pa
    from pyspark import TaskContext

    _quiet_worker()
    context = TaskContext.get()
    if context is None:
        task = function.task(None)
    else:
        task = function.task(
            context.getLocalProperty(BATCH_PROPERTY),
            context.getLocalProperty(SPARK_BATCH_PROPERTY),
        )
    first = next((b for b in batches if b.num_rows), None)
    if first is None:
        return  # nothing to tell which partition this is: the driver advances G for it
    topic = task.topic
    if topic is None:
        topic = first.column(SOURCE_TOPIC)[0].as_py()
    tp = (topic, first.column(SOURCE_PARTITION)[0].as_py())
    if tp not in task.end_offsets:
        raise PipelineFailed(f"rows of {tp} are not in this batch's offsets {task.end_offsets}")
    rows = chain([first], batches)
    outcome = None
    if task.hand_off is not None:  # the executor's producer hub, if it has one
        outcome = task.hand_off.commit(task, tp, first, rows)
    if outcome is None:
        outcome = commit_partition(task, tp, rows)
    yield pa.RecordBatch.from_pylist([outcome.__dict__])


def _warm_up(_: Iterable[Any]) -> Iterator[int]:
    import confluent_kafka
    import pandas  # type: ignore[import-untyped]
    import pyarrow.compute

    yield len(confluent_kafka.version()) + len(pandas.__name__) + len(pyarrow.compute.__name__)


def warm_up_workers(spark: SparkSession, tasks: int) -> None:
    """Start Python workers with this module's imports, so the first batch does not wait.

    Spark reuses idle Python workers; importing pyarrow and confluent-kafka in
    a fresh one takes seconds, which would otherwise add to every restart's
    first batch.
    """
    spark.sparkContext.parallelize(range(tasks), tasks).mapPartitions(_warm_up).count()
