"""A confluent-kafka transactional producer with the error handling its docs prescribe.

* retriable errors (``KafkaError.retriable()``): call the same API again, until the
  call's timeout, which for the calls inside a transaction (``send_offsets_to_transaction``,
  ``commit_transaction``) ends with the transaction's own timeout (the broker aborts it then;
  see :data:`IN_TRANSACTION_FLOOR_S`); then the batch may be tried again, with a new producer;
* abortable errors (``txn_requires_abort()``): abort the transaction; the
  producer stays usable and the batch can be tried again;
* fatal errors (``fatal()``, e.g. fenced by a newer holder of the id): the
  producer is dead; a new one must be built (its ``init_transactions`` fences
  in turn and aborts whatever was left open).

Failures surface as :class:`~eop_spark.contract.errors.SinkRetryable` (the caller may
retry the batch), :class:`~eop_spark.contract.errors.BrokerUnavailable` (a subclass: a
broker stayed away through the retries; the batch is retried for longer),
:class:`~eop_spark.contract.errors.ProducerFenced` (a subclass: the
caller rebuilds the producer first) or :class:`~eop_spark.contract.errors.PipelineFailed`
(no retry helps: authorization, unknown topic...).

Records go through confluent-kafka's ``produce()``, unless the caller plugs in
an :class:`ArrowPath`: a way to queue whole Arrow columns into the producer's
librdkafka handle (the runner plugs in :mod:`eop_spark.speedups.native_produce`;
see :meth:`TransactionalProducer.produce_arrow`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from eop_spark.contract.errors import (
    BrokerUnavailable,
    PipelineFailed,
    ProducerFenced,
    SinkRetryable,
)
from eop_spark.contract.offsets import Offsets
from eop_spark.contract.progress_names import ProgressNames

log = logging.getLogger(__name__)

#: How long one blocking transaction API call may retry retriable errors.
CALL_TIMEOUT_S = 60.0
#: The least a call inside a transaction retries, even once the transaction outlived
#: ``transaction.timeout.ms``: the broker aborts such a transaction only at its next check
#: (``transaction.abort.timed.out.transaction.cleanup.interval.ms``, 10 s by default), and a
#: commit it accepted before then completes.  Past this, a broker that is still away (a
#: partition without enough in-sync replicas, a coordinator moving) costs the batch an
#: attempt (:mod:`eop_spark.exactly_once.retries`) rather than a minute on a transaction
#: the broker has aborted.
IN_TRANSACTION_FLOOR_S = 10.0
#: How much Arrow data queued records may point into before :meth:`TransactionalProducer.
#: produce_arrow` waits for them to be delivered and lets go of it.  Copies in librdkafka
#: would be bounded by ``queue.buffering.max.messages`` (500,000: 500 MB of 1 KiB records).
HOLD_LIMIT_BYTES = 128 * 1024 * 1024
#: How long :meth:`TransactionalProducer.produce_arrow` waits for a topic's partition count
#: (once per transaction); without it librdkafka's partitioner places the records.
METADATA_TIMEOUT_S = 10.0

T = TypeVar("T")

# librdkafka logs expected events (a cached producer fenced by the driver or a newer
# runner) as fatal errors; every failure surfaces as an exception instead, so its log
# is dropped (even at level 0 it would print to stderr otherwise).
_LIBRDKAFKA_LOG = logging.getLogger("eop_spark.librdkafka.producer")
_LIBRDKAFKA_LOG.addHandler(logging.NullHandler())
_LIBRDKAFKA_LOG.propagate = False

#: How long past its own timeout a librdkafka call may block before the producer is given up.
OVERRUN_S = 5.0
#: Producers given up in a call that blocked past its timeout: referenced for good, since
#: destroying a client while a call runs in it is not safe (one per such event).
_ABANDONED: list[Any] = []


class ArrowQueue(Protocol):
    """One producer's way to queue Arrow columns (what :meth:`ArrowPath.attach` returns)."""

    def produce(
        self, topic: str, value: Any, key: Any, start: int, partitions: Any
    ) -> tuple[int, int]:
        """Queue the records from ``start`` on; ``(records queued, librdkafka error code)``.

        ``partitions``: each record's partition (from :meth:`ArrowPath.partitions`), or
        None to let librdkafka's partitioner place them.
        """
        ...


class ArrowPath(Protocol):
    """A way to queue Arrow columns into a confluent-kafka producer's librdkafka handle.

    Plain data (the sinks ship it to Spark tasks inside their settings).
    """

    @property
    def queue_full(self) -> int:
        """The librdkafka error code that means "the local queue is full: wait, go on"."""
        ...

    @property
    def partitioners(self) -> tuple[str, ...]:
        """The partitioners :meth:`partitions` computes as librdkafka does."""
        ...

    def attach(self, producer: Any, transactional_id: str) -> ArrowQueue | None:
        """The queue for ``producer`` (a confluent-kafka ``Producer``), None if not usable."""
        ...

    def partitions(self, key: Any, rows: int, count: int, partitioner: str) -> Any:
        """Each record's partition among ``count``, as librdkafka's ``partitioner`` places it."""
        ...


def _kafka_error(exc: BaseException) -> Any:
    args = getattr(exc, "args", ())
    return args[0] if args else None


def _broker_away(error: Any) -> bool:
    """Whether ``error`` says a broker (a leader, a coordinator, enough replicas) was away.

    Retriable errors, and the abortable ones they leave when records outlive
    their delivery timeout (``message.timeout.ms``, at most the transaction's).
    """
    from confluent_kafka import KafkaError

    return bool(error.retriable()) or error.code() in {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }


def _is_fenced(error: Any) -> bool:
    from confluent_kafka import KafkaError

    return error.code() in {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    }


class TransactionalProducer:
    """One transactional id's producer: ``init_transactions`` on creation, then transactions."""

    def __init__(
        self,
        conf: Mapping[str, Any],
        timeout: float = CALL_TIMEOUT_S,
        *,
        arrow_path: ArrowPath | None = None,
    ) -> None:
        """Create the producer and fence every older holder of its transactional id.

        ``arrow_path``: how :meth:`produce_arrow` queues Arrow columns (None: it cannot).
        """
        from confluent_kafka import Producer

        self.transactional_id: str = str(conf["transactional.id"])
        self._transaction_timeout_s = int(conf.get("transaction.timeout.ms", 60_000)) / 1000.0
        #: When the open transaction outlives its timeout (time.monotonic()).
        self._transaction_deadline = 0.0
        self._fatal: Any = None
        self._abandoned = False
        self.in_transaction = False
        self._producer = Producer({**conf, "error_cb": self._on_error, "logger": _LIBRDKAFKA_LOG})
        self._arrow_path = arrow_path
        self._arrow_queue = (
            arrow_path.attach(self._producer, self.transactional_id) if arrow_path else None
        )
        # With a partitioner produce_arrow can compute, it places records itself and
        # enqueues them a partition at a time (see ArrowPath); topic -> partitions.
        self._partitioner = str(conf.get("partitioner", ""))
        self._partition_counts: dict[str, int | None] = {}
        # The Arrow arrays that records queued by produce_arrow point into, and their size.
        self._held: list[Any] = []
        self._held_bytes = 0
        #: What this producer's own commits left in G, under a key of the caller's
        #: choosing; true only while it holds its epoch (a fenced commit refutes it).
        self.known_progress: dict[Any, int] = {}
        self._call(lambda t: self._producer.init_transactions(t), "init_transactions", timeout)

    def _on_error(self, error: Any) -> None:
        if error.fatal():
            self._fatal = error
        else:
            log.debug("%s: %s", self.transactional_id, error)

    @property
    def usable(self) -> bool:
        """False once a fatal error (such as being fenced) killed the producer."""
        return self._fatal is None

    def _raise(self, error: Any, what: str) -> None:
        from confluent_kafka import KafkaError

        if error is not None and error.code() == KafkaError._FATAL and self._fatal is not None:
            error = self._fatal  # "Local: Fatal error" stands for the error error_cb got
        text = f"{what} of transactional id {self.transactional_id!r} failed: {error}"
        if error is not None and _is_fenced(error):
            self._fatal = error
            raise ProducerFenced(
                f"transactional id {self.transactional_id!r} was fenced during {what}: "
                "another runner of this pipeline took it over"
            )
        # _FATAL before error_cb has reported the fatal error itself (records queued by
        # an Arrow path get the bare code): the producer is dead all the same.
        if error is not None and (error.fatal() or error.code() == KafkaError._FATAL):
            self._fatal = error
            raise SinkRetryable(text)
        if error is not None and error.txn_requires_abort():
            raise BrokerUnavailable(text) if _broker_away(error) else SinkRetryable(text)
        if error is not None and error.retriable():
            # Still retriable at the call's timeout: a broker (a coordinator, a leader) is
            # away for longer, as in a rolling restart on a busy cluster. The batch may be
            # tried again, with a new producer: this one may be midway through the call,
            # and a new one's init_transactions completes or aborts what it left open.
            self._fatal = error
            raise BrokerUnavailable(text)
        raise PipelineFailed(text)

    def _call(self, fn: Callable[[float], T], what: str, timeout: float) -> T:
        """Run a blocking transaction API call, retrying retriable errors until ``timeout``."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + timeout
        while True:
            remaining = max(1.0, deadline - time.monotonic())
            try:
                return fn(remaining)
            except KafkaException as exc:
                error = _kafka_error(exc)
                if error is None or not error.retriable() or time.monotonic() >= deadline:
                    self._raise(error, what)
                    raise  # unreachable: _raise always raises
                time.sleep(0.1)

    def _bounded(self, call: Callable[[], T], timeout: float, what: str) -> T:
        """``call()`` (a librdkafka call given ``timeout``), given up ``OVERRUN_S`` after it.

        A call that is still blocked then leaves this producer dead (a new one's
        ``init_transactions`` fences it) and fails the batch, which may be tried again.
        """
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append((True, call()))
            except BaseException as exc:
                outcome.append((False, exc))

        worker = threading.Thread(target=run, name=f"eop-{what}", daemon=True)
        worker.start()
        worker.join(timeout + OVERRUN_S)
        if not outcome:
            from confluent_kafka import KafkaError

            text = f"{what} blocked for {timeout + OVERRUN_S:.0f}s, past its timeout"
            self._fatal = KafkaError(KafkaError._TIMED_OUT, text, fatal=True)
            self._abandoned = True
            raise BrokerUnavailable(
                f"{text} (transactional id {self.transactional_id!r}): a new producer takes over"
            )
        ok, value = outcome[0]
        if not ok:
            raise value
        result: T = value
        return result

    def begin(self) -> None:
        """Begin a transaction."""
        from confluent_kafka import KafkaException

        if self._fatal is not None:
            self._raise(self._fatal, "begin_transaction")
        self._partition_counts.clear()  # a topic may have gained partitions since
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            self._raise(_kafka_error(exc), "begin_transaction")
        self.in_transaction = True
        self._transaction_deadline = time.monotonic() + self._transaction_timeout_s

    def _in_transaction(self, timeout: float) -> float:
        """``timeout`` cut to what the open transaction has left, :data:`IN_TRANSACTION_FLOOR_S`
        at the least."""
        left = self._transaction_deadline - time.monotonic()
        return min(timeout, max(IN_TRANSACTION_FLOOR_S, left))

    def send_offsets(
        self,
        offsets: Offsets,
        group_metadata: Any,
        marker: str = "",
        *,
        names: ProgressNames,
        timeout: float = CALL_TIMEOUT_S,
    ) -> None:
        """Add ``offsets`` for G (``marker`` as their metadata) to the open transaction.

        ``offsets`` are of source partitions; ``names`` says which
        topic-partitions G holds them under (see :mod:`eop_spark.contract.progress_names`).
        """
        from confluent_kafka import TopicPartition

        positions = [
            TopicPartition(t, p, o, metadata=marker)
            for (t, p), o in sorted(names.stored(offsets).items())
        ]
        # librdkafka 2.16 can block in this call past its timeout when G's coordinator went
        # away (confluentinc/librdkafka#5456, #5511): it is bounded here.
        timeout = self._in_transaction(timeout)
        self._call(
            lambda t: self._bounded(
                lambda: self._producer.send_offsets_to_transaction(positions, group_metadata, t),
                t,
                "send_offsets_to_transaction",
            ),
            "send_offsets_to_transaction",
            timeout,
        )

    def produce_one(
        self, topic: str, value: Any, key: Any, kwargs: Mapping[str, Any] | None = None
    ) -> None:
        """Queue one record, waiting while the local queue is full."""
        from confluent_kafka import KafkaException

        producer = self._producer
        while True:
            try:
                if kwargs:
                    producer.produce(topic, value, key, **kwargs)
                else:
                    producer.produce(topic, value, key)
                return
            except BufferError:
                self._wait_for_room()
            except KafkaException as exc:
                self._raise(_kafka_error(exc), "produce")

    def produce_pairs(self, topic: str, values: Iterable[Any], keys: Iterable[Any]) -> None:
        """Queue ``(value, key)`` records (bytes, str or None), one ``produce`` call each.

        For records that need nothing else this is the cheapest way through the
        Python client: cheaper per record than building the dicts ``produce_batch`` takes.
        """
        from confluent_kafka import KafkaException

        produce = self._producer.produce
        for value, key in zip(values, keys, strict=True):
            try:
                produce(topic, value, key)
            except BufferError:
                self.produce_one(topic, value, key)  # waits until the queue has room
            except KafkaException as exc:
                self._raise(_kafka_error(exc), "produce")

    def _wait_for_room(self) -> None:
        """The local queue is full: let librdkafka send a moment (raises if the producer died)."""
        self._producer.poll(0.05)
        if self._fatal is not None:
            self._raise(self._fatal, "produce")

    @property
    def takes_arrow(self) -> bool:
        """Whether :meth:`produce_arrow` can queue Arrow columns (through an :class:`ArrowPath`)."""
        return self._arrow_queue is not None

    def produce_arrow(self, topic: str, value: Any, key: Any = None) -> None:
        """Queue records given as Arrow arrays (value, optional key).

        Only when :attr:`takes_arrow`.  With a Java-compatible partitioner
        (``murmur2_random``, the default, or ``murmur2``) the records are
        placed here, as librdkafka would, and queued a partition at a time.
        Waits while the local queue is full;
        any other refusal raises like :meth:`produce_one`.  librdkafka's
        records point into the arrays' buffers (nothing is copied), so the
        producer keeps the arrays until their records are delivered: the
        commit or abort of the transaction, or a wait for delivery once it
        holds :data:`HOLD_LIMIT_BYTES`.
        """
        from confluent_kafka import KafkaError

        if self._arrow_queue is None or self._arrow_path is None:
            raise RuntimeError("produce_arrow without an Arrow path: check takes_arrow")
        if self._held_bytes >= HOLD_LIMIT_BYTES:
            self._settle()
        self._held.append((value, key))
        self._held_bytes += value.nbytes + (key.nbytes if key is not None else 0)
        placed = None
        count = self._partition_count(topic)
        if count:
            placed = self._arrow_path.partitions(key, len(value), count, self._partitioner)
        done = 0
        while done < len(value):
            queued, code = self._arrow_queue.produce(topic, value, key, done, placed)
            done += queued
            if code == self._arrow_path.queue_full:
                self._wait_for_room()
            elif code:
                self._raise(KafkaError(code), "produce")

    def _partition_count(self, topic: str) -> int | None:
        """``topic``'s partitions (asked once per transaction), or None: let librdkafka place."""
        from confluent_kafka import KafkaException

        if self._arrow_path is None or self._partitioner not in self._arrow_path.partitioners:
            return None
        if topic not in self._partition_counts:
            count = None
            with contextlib.suppress(KafkaException):
                metadata = self._producer.list_topics(topic, timeout=METADATA_TIMEOUT_S)
                found = metadata.topics.get(topic)
                if found is not None and found.error is None and found.partitions:
                    count = len(found.partitions)
            # A missing topic or no metadata: produce() reports it, as without the count.
            self._partition_counts[topic] = count
        return self._partition_counts[topic]

    def _settle(self) -> None:
        """Wait until every queued record is delivered, then let go of their Arrow data."""
        remaining = self._producer.flush(CALL_TIMEOUT_S)
        if self._fatal is not None:
            self._raise(self._fatal, "produce")
        if remaining:
            raise BrokerUnavailable(
                f"{remaining} records of transactional id {self.transactional_id!r} were not "
                f"delivered within {CALL_TIMEOUT_S:.0f} s"
            )
        self._let_go()

    def _let_go(self) -> None:
        """Release the Arrow data of delivered records (all of them: nothing is queued)."""
        if len(self._producer) == 0:
            self._held.clear()
            self._held_bytes = 0

    def commit(self, timeout: float = CALL_TIMEOUT_S) -> None:
        """Commit the open transaction (flushes queued records first).

        Retriable errors are retried until ``timeout`` or the transaction's own timeout,
        whichever comes first (see :data:`IN_TRANSACTION_FLOOR_S`).
        """
        timeout = self._in_transaction(timeout)
        self._call(lambda t: self._producer.commit_transaction(t), "commit_transaction", timeout)
        self.in_transaction = False
        self._let_go()

    def abort(self, timeout: float = CALL_TIMEOUT_S) -> bool:
        """Abort the open transaction, if the producer can; return whether it did."""
        from confluent_kafka import KafkaException

        if not self.in_transaction:
            return False
        self.in_transaction = False
        if self._fatal is not None:
            return False  # a dead producer cannot abort; the next init_transactions will
        try:
            self._producer.abort_transaction(timeout)  # waits for the records in flight
            self._let_go()
            return True
        except KafkaException as exc:
            log.warning("abort of %s failed: %s", self.transactional_id, _kafka_error(exc))
            self._fatal = _kafka_error(exc)
            return False

    def close(self) -> None:
        """Drop queued records and release the client (an open transaction is left to abort).

        Records still queued or in flight may point into Arrow data given to
        :meth:`produce_arrow`: the client goes first (destroying it joins
        librdkafka's threads), the data after.
        """
        from confluent_kafka import KafkaException

        if not hasattr(self, "_producer"):
            return  # closed already
        if self._abandoned:  # a call may still run in it
            _ABANDONED.append(self._producer)
            del self._producer
            return
        try:
            self._producer.purge()
            self._producer.flush(0)
        except KafkaException:
            pass
        self._arrow_queue = None
        del self._producer  # the last reference: rd_kafka_destroy() runs here
        self._held.clear()
        self._held_bytes = 0

    def __del__(self) -> None:
        """Close a producer nobody closed, in :meth:`close`'s order (client, then data)."""
        if getattr(self, "_held", None):
            with contextlib.suppress(Exception):  # at interpreter exit, imports may fail
                self.close()
