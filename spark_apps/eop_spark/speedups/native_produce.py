"""Queue Arrow columns into librdkafka with one call per batch: the sinks' fast path.

``Producer.produce()`` of confluent-kafka costs about a microsecond of Python
per record (argument parsing, a topic lookup, the call itself), on top of
turning every Arrow value into a Python ``bytes`` object first.  For 100-byte
records that was half of all the CPU the partitioned sink adds to a query.
librdkafka itself takes a whole array of records in one call,
``rd_kafka_produce_batch()``, and Arrow keeps a binary column as one data
buffer plus an offsets buffer: the array of ``rd_kafka_message_t`` (pointer
and length of each value and key) is computed from those buffers with a few
numpy operations.  librdkafka does not copy the bytes (no
``RD_KAFKA_MSG_F_COPY``): its records point into the Arrow buffers until they
are delivered, and the caller keeps the arrays alive until then
(:meth:`eop_spark.kafka.transactional_producer.TransactionalProducer.produce_arrow`).  The
copy (a ``memcpy`` and a heap block of the record's size for each record) was
a quarter of the Python workers' and the hub's CPU at 1 KiB records.

This talks to the very librdkafka instance confluent-kafka loaded (the shared
library its wheel ships), on the producer confluent-kafka created: the
transaction calls, error callbacks and delivery all stay with confluent-kafka;
only the enqueueing of records is done here.  The ``rd_kafka_t`` handle is the
first field after the Python object header of a confluent-kafka client (its C
``Handle`` struct in the 2.x releases); it is used only after three checks:
confluent-kafka's major version is a known one, the
library reports the version confluent-kafka reports, and the handle's opaque
pointer is the Python producer object itself (confluent-kafka registers it so)
with the producer's own ``transactional.id``.  If any check fails (another
build of confluent-kafka, a statically linked librdkafka), :func:`attach`
returns ``None`` and the sinks use ``produce()``, as before.  The runner plugs
this path into the sinks' producers as :class:`NativeProduce` (an
:class:`~eop_spark.kafka.transactional_producer.ArrowPath`).

Records with headers or a target partition go through ``produce()``: the batch
call has no headers, and when records name their partition each
(``RD_KAFKA_MSG_F_PARTITION``) before the producer knows the topic's
metadata, librdkafka 2.x adds the topic's *unassigned* partition to the
transaction, which the broker refuses (seen with a fresh topic).

With librdkafka's Java-compatible partitioners (``murmur2_random``, eop's
default, and ``murmur2``) the caller may pass each record's partition, as
:func:`partitions` computes it: the records then go in one call per
partition, with the partition as the call's argument (a path that leaves the
unassigned partition out of the transaction).  Passed one by one to the
partitioner, the records of 4 partitions interleaved on their queues, and
librdkafka's sending thread took twice the CPU (0.48-0.59 against 0.20-0.25
core-seconds per million 100-byte records, side by side in one process).

A little longer than most modules: librdkafka's message struct, the handle's
three checks and Kafka's murmur2 (vectorised) have to agree with each other
byte for byte, and are read together.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging
import os
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

log = logging.getLogger(__name__)

#: Set (to anything but 0) to turn the fast path off: every record goes through produce().
DISABLE_ENV = "EOP_NO_NATIVE_PRODUCE"
#: confluent-kafka major versions whose client objects start with ``rd_kafka_t *rk``
#: (the one pinned and tested; a new major version falls back until checked).
KNOWN_MAJOR_VERSIONS = ("2",)

_MSG_F_NONE = 0  # neither RD_KAFKA_MSG_F_COPY nor F_FREE: the caller owns the bytes
_PARTITION_UA = -1
_RD_KAFKA_PRODUCER = 0
_CONF_OK = 0
ERR_QUEUE_FULL = -184


class Librdkafka:
    """The librdkafka functions the fast path calls, from confluent-kafka's own copy."""

    def __init__(self, path: str) -> None:
        """Open ``path`` (already loaded by confluent-kafka: the same instance is returned)."""
        lib = ctypes.CDLL(path)
        p, i, c = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
        for name, restype, argtypes in (
            ("rd_kafka_version", i, []),
            ("rd_kafka_type", i, [p]),
            ("rd_kafka_opaque", p, [p]),
            ("rd_kafka_conf", p, [p]),
            ("rd_kafka_conf_get", i, [p, c, c, ctypes.POINTER(ctypes.c_size_t)]),
            ("rd_kafka_topic_new", p, [p, c, p]),
            ("rd_kafka_topic_destroy", None, [p]),
            ("rd_kafka_last_error", i, []),
            ("rd_kafka_produce_batch", i, [p, ctypes.c_int32, i, p, i]),
        ):
            function = getattr(lib, name)
            function.restype, function.argtypes = restype, argtypes
        self.lib = lib

    def conf_value(self, rk: int, name: str) -> str | None:
        """The value of property ``name`` in the configuration ``rk`` was created with."""
        size = ctypes.c_size_t(512)
        buffer = ctypes.create_string_buffer(size.value)
        conf = self.lib.rd_kafka_conf(rk)
        if not conf or self.lib.rd_kafka_conf_get(conf, name.encode(), buffer, size) != _CONF_OK:
            return None
        return buffer.value.decode()


def _loaded_librdkafka() -> str | None:
    """The path of the librdkafka shared library mapped into this process, if any."""
    import confluent_kafka.cimpl  # noqa: F401  (maps the library confluent-kafka uses)

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "librdkafka" in line}
    except OSError:
        return None
    paths = {p for p in paths if p.startswith("/")}
    return paths.pop() if len(paths) == 1 else None


@functools.cache
def librdkafka() -> Librdkafka | None:
    """confluent-kafka's librdkafka, or ``None`` when it cannot be used safely."""
    import confluent_kafka

    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        log.info("%s is set: records go through produce()", DISABLE_ENV)
        return None
    if confluent_kafka.version()[0].split(".")[0] not in KNOWN_MAJOR_VERSIONS:
        log.info("confluent-kafka %s: records go through produce()", confluent_kafka.version()[0])
        return None
    path = _loaded_librdkafka()
    if path is None:
        log.info("no shared librdkafka found next to confluent-kafka: records go through produce()")
        return None
    lib = Librdkafka(path)
    if lib.lib.rd_kafka_version() != confluent_kafka.libversion()[1]:
        log.info("%s is not confluent-kafka's librdkafka: records go through produce()", path)
        return None
    return lib


@dataclass(frozen=True)
class NativeProducer:
    """Enqueue Arrow columns on one confluent-kafka producer's librdkafka handle."""

    lib: Librdkafka
    rk: int
    owner: Any  # the confluent-kafka Producer: keeps the handle alive

    def produce(
        self,
        topic: str,
        value: pa.Array,
        key: pa.Array | None = None,
        start: int = 0,
        partitions: np.ndarray[Any, Any] | None = None,
    ) -> tuple[int, int]:
        """Enqueue the records from ``start`` on; return ``(records enqueued, error code)``.

        ``value`` and ``key`` are binary or string arrays (nulls become null
        value or key).  Without ``partitions`` the configured partitioner
        places each record, and records are enqueued in row order; with them
        (each row's partition, from :func:`partitions`) records are enqueued
        partition by partition, each partition's in row order, and ``start``
        counts records in that order.  The queued records point into their
        buffers: keep both arrays alive until the records are delivered
        (``flush``, or the commit or abort of the transaction, returned) or
        the client is destroyed.
        Enqueueing stops at the first record librdkafka refuses: the first
        ``enqueued`` records from ``start`` on are queued and the error code
        (librdkafka's ``rd_kafka_resp_err_t``, 0 if none) says why the next one
        was not (:data:`ERR_QUEUE_FULL`: wait, then call again from there,
        with the same ``partitions``).
        """
        import numpy as np

        if len(value) - start <= 0:
            return 0, 0
        fields = {"payload": _pointers(value)} | (
            {"key": _pointers(key)} if key is not None else {}
        )
        runs = [(_PARTITION_UA, 0, len(value))]
        if partitions is not None:
            order = np.argsort(partitions, kind="stable")  # keeps each partition's row order
            placed = partitions[order]
            fields = {name: (at[order], size[order]) for name, (at, size) in fields.items()}
            edges = np.flatnonzero(np.diff(placed)) + 1
            bounds = [0, *edges.tolist(), len(value)]
            runs = [(int(placed[a]), a, b) for a, b in itertools.pairwise(bounds)]
        messages = np.zeros(len(value), _message_dtype())
        for name, (at, size) in fields.items():
            messages[name], messages["len" if name == "payload" else "key_len"] = at, size
        lib = self.lib.lib
        rkt = lib.rd_kafka_topic_new(self.rk, topic.encode(), None)
        if not rkt:
            return 0, int(lib.rd_kafka_last_error())
        try:
            for partition, first, end in runs:
                first = max(first, start)
                if first >= end:
                    continue
                part = messages[first:end]
                good = lib.rd_kafka_produce_batch(
                    rkt, partition, _MSG_F_NONE, part.ctypes.data, end - first
                )
                if good != end - first:
                    refused = int(np.flatnonzero(part["err"])[0])
                    # Records after a refused one may have been queued (an error of that
                    # record alone): report only the queued prefix, and the error that ended it.
                    return first + refused - start, int(part["err"][refused])
        finally:
            lib.rd_kafka_topic_destroy(rkt)
        return len(value) - start, 0


def attach(producer: Any, transactional_id: str | None) -> NativeProducer | None:
    """The fast path for a confluent-kafka ``Producer``, or ``None`` if it cannot be used.

    ``transactional_id`` is the producer's (None for one without transactions):
    the handle must have been made with it.
    """
    from confluent_kafka import Producer

    lib = librdkafka()
    if lib is None or not isinstance(producer, Producer):
        return None
    rk = ctypes.c_void_p.from_address(id(producer) + object.__basicsize__).value
    if (
        not rk
        or lib.lib.rd_kafka_opaque(rk) != id(producer)
        or lib.lib.rd_kafka_type(rk) != _RD_KAFKA_PRODUCER
        or lib.conf_value(rk, "transactional.id") != transactional_id
    ):
        log.info("producer %s: handle check failed, records go through produce()", transactional_id)
        return None
    return NativeProducer(lib, rk, producer)


@functools.cache
def _message_dtype() -> np.dtype[Any]:
    """``rd_kafka_message_t`` of librdkafka's ``rdkafka.h``, as a numpy record (x86-64, arm64)."""
    import numpy as np

    return np.dtype(
        {
            # `void *_private` (no per-record state: NULL) is a named field too: numpy's copies
            # of a structured array (take, fancy indexing) copy named fields only, and would
            # leave it undefined, which confluent-kafka's delivery callback reads as an object.
            "names": [
                *("err", "rkt", "partition", "payload", "len", "key", "key_len", "offset"),
                "private",
            ],
            "formats": ["<i4", "<u8", "<i4", "<u8", "<u8", "<u8", "<u8", "<i8", "<u8"],
            "offsets": [0, 8, 16, 24, 32, 40, 48, 56, 64],
            "itemsize": 72,
        }
    )


def _offsets(array: pa.Array) -> tuple[np.ndarray[Any, Any], Any]:
    """The offsets (``len + 1``) of a binary or string array's values, and its data buffer."""
    import numpy as np
    import pyarrow as pa

    large = pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type)
    width = 8 if large else 4
    _, offsets_buffer, data = array.buffers()
    offsets = np.frombuffer(
        offsets_buffer,
        dtype=np.int64 if large else np.int32,
        count=len(array) + 1,
        offset=array.offset * width,
    )
    return offsets, data


def _pointers(array: pa.Array) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Address and length of every value of a binary or string array (0, 0 for nulls)."""
    import numpy as np

    offsets, data = _offsets(array)
    # An empty (not null) value needs a non-NULL pointer: NULL means a null value.
    base = data.address if data is not None and data.address else _EMPTY_ADDRESS
    lengths = np.diff(offsets).astype(np.uint64)
    addresses = offsets[:-1].astype(np.uint64) + np.uint64(base)
    if array.null_count:
        nulls = array.is_null().to_numpy(zero_copy_only=False)
        addresses[nulls] = 0
        lengths[nulls] = 0
    return addresses, lengths


#: Kafka's murmur2 (Java clients' ``Utils.murmur2``, librdkafka's ``rd_murmur2``).
_MURMUR2_SEED, _MURMUR2_M = 0x9747B28C, 0x5BD1E995


def murmur2(array: pa.Array) -> np.ndarray[Any, Any]:
    """Kafka's murmur2 hash of every value of a binary or string array (nulls hash as empty).

    Vectorised over the rows: the i-th 4-byte block of every value at least
    ``4 * (i + 1)`` bytes long at a time, then the 0-3 bytes left of each.
    """
    import numpy as np

    offsets, data = _offsets(array)
    starts = offsets[:-1].astype(np.int64)
    lengths = np.diff(offsets).astype(np.int64)
    if array.null_count:
        lengths[array.is_null().to_numpy(zero_copy_only=False)] = 0
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    # Every 4 bytes from every offset as a little-endian word (an unaligned, overlapping view).
    words = np.ndarray((max(len(raw) - 3, 0),), dtype="<u4", buffer=raw, strides=(1,))
    m = np.uint32(_MURMUR2_M)

    def byte(at: np.ndarray[Any, Any], shift: int) -> np.ndarray[Any, Any]:
        return raw[at].astype(np.uint32) << np.uint32(shift)  # type: ignore[no-any-return]

    h = np.uint32(_MURMUR2_SEED) ^ lengths.astype(np.uint32)
    rows = np.arange(len(lengths))
    block = 0
    while True:
        rows = rows[lengths[rows] >= 4 * (block + 1)]
        if rows.size == 0:
            break
        every = rows.size == len(lengths)  # all keys this long: no gather of h
        k = words[(starts if every else starts[rows]) + 4 * block].astype(np.uint32)
        k *= m
        k ^= k >> np.uint32(24)
        k *= m
        if every:
            h *= m
            h ^= k
        else:
            h[rows] = (h[rows] * m) ^ k
        block += 1
    left = lengths % 4
    tail = starts + lengths - left
    for size, shift in ((3, 16), (2, 8), (1, 0)):
        rows = np.flatnonzero(left >= size)
        h[rows] ^= byte(tail[rows] + size - 1, shift)
    rows = np.flatnonzero(left > 0)
    h[rows] *= m
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    return h


#: The partitioners :func:`partitions` computes as librdkafka does.
JAVA_COMPATIBLE_PARTITIONERS = ("murmur2_random", "murmur2")


def partitions(
    key: pa.Array | None, rows: int, count: int, partitioner: str
) -> np.ndarray[Any, Any]:
    """Each record's partition among ``count``, as librdkafka's ``partitioner`` places it.

    A keyed record's is murmur2 of its key (as a Java producer's).  Records
    without a key: ``murmur2`` hashes them as an empty key; ``murmur2_random``
    sends them to one random partition (librdkafka's sticky partitioner keeps
    one for ``sticky.partitioning.linger.ms``).
    """
    import numpy as np
    import pyarrow as pa

    if partitioner not in JAVA_COMPATIBLE_PARTITIONERS:
        raise ValueError(f"partitioner {partitioner!r} is not {JAVA_COMPATIBLE_PARTITIONERS}")
    if key is None and partitioner == "murmur2_random":
        return np.full(rows, random.randrange(count), np.int32)  # no key to hash
    if key is None:
        key = pa.nulls(rows, pa.binary())
    placed = ((murmur2(key) & np.uint32(0x7FFFFFFF)) % np.uint32(count)).astype(np.int32)
    if partitioner == "murmur2_random" and key.null_count:
        # Python's generator is reseeded in forked children (numpy's is not): Spark's
        # workers, forked from one daemon, would otherwise all pick the same partitions.
        placed[key.is_null().to_numpy(zero_copy_only=False)] = random.randrange(count)
    return placed


_EMPTY = ctypes.create_string_buffer(1)
_EMPTY_ADDRESS = ctypes.addressof(_EMPTY)


@dataclass(frozen=True)
class NativeProduce:
    """This module as the transactional producer's Arrow path (``ArrowPath``).

    Plain data: it travels to Spark tasks inside the sink's settings, and
    each process that builds a producer attaches it there (:func:`attach`).
    """

    queue_full: int = ERR_QUEUE_FULL
    partitioners: tuple[str, ...] = JAVA_COMPATIBLE_PARTITIONERS

    def attach(self, producer: Any, transactional_id: str) -> NativeProducer | None:
        """The fast path for ``producer`` (:func:`attach`)."""
        return attach(producer, transactional_id)

    def partitions(
        self, key: pa.Array | None, rows: int, count: int, partitioner: str
    ) -> np.ndarray[Any, Any]:
        """Each record's partition (:func:`partitions`)."""
        return partitions(key, rows, count, partitioner)
