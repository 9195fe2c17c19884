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
(:meth:`eop_spark.transactions.TransactionalProducer.produce_arrow`).  The
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
returns ``None`` and the sinks use ``produce()``, as before.

Records with headers or a target partition go through ``produce()``: the batch
call has no headers, and when records name their partition before the
producer knows the topic's metadata, librdkafka 2.x adds the topic's
*unassigned* partition to the transaction, which the broker refuses (seen
with a fresh topic); without a partition, records wait for the metadata and
the partitioner, as ``produce()``'s do.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
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
    ) -> tuple[int, int]:
        """Enqueue the records from row ``start`` on; return ``(rows enqueued, error code)``.

        ``value`` and ``key`` are binary or string arrays (nulls become null
        value or key); the configured partitioner places each record.  The
        queued records point into their buffers: keep both arrays alive until
        the records are delivered (``flush``, or the commit or abort of the
        transaction, returned) or the client is destroyed.
        Enqueueing stops at the first record librdkafka refuses: rows
        ``start`` to ``start + enqueued`` are queued, in order, and the error
        code (librdkafka's ``rd_kafka_resp_err_t``, 0 if none) says why the
        next one was not (:data:`ERR_QUEUE_FULL`: wait, then call again from
        there).
        """
        import numpy as np

        count = len(value) - start
        if count <= 0:
            return 0, 0
        messages = np.zeros(count, _message_dtype())
        messages["payload"], messages["len"] = _pointers(value.slice(start))
        if key is not None:
            messages["key"], messages["key_len"] = _pointers(key.slice(start))
        lib = self.lib.lib
        rkt = lib.rd_kafka_topic_new(self.rk, topic.encode(), None)
        if not rkt:
            return 0, int(lib.rd_kafka_last_error())
        try:
            good = lib.rd_kafka_produce_batch(
                rkt, _PARTITION_UA, _MSG_F_NONE, messages.ctypes.data, count
            )
        finally:
            lib.rd_kafka_topic_destroy(rkt)
        if good == count:
            return count, 0
        errors = messages["err"]
        first = int(np.flatnonzero(errors)[0])
        # Records after a refused one may have been queued (an error of that record
        # alone): report only the queued prefix, and the error that ended it.
        return first, int(errors[first])


def attach(producer: Any, transactional_id: str) -> NativeProducer | None:
    """The fast path for a confluent-kafka ``Producer``, or ``None`` if it cannot be used."""
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
            "names": ["err", "rkt", "partition", "payload", "len", "key", "key_len", "offset"],
            "formats": ["<i4", "<u8", "<i4", "<u8", "<u8", "<u8", "<u8", "<i8"],
            "offsets": [0, 8, 16, 24, 32, 40, 48, 56],
            "itemsize": 72,  # and `void *_private` at 64: NULL, no per-record state
        }
    )


def _pointers(array: pa.Array) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Address and length of every value of a binary or string array (0, 0 for nulls)."""
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
    # An empty (not null) value needs a non-NULL pointer: NULL means a null value.
    base = data.address if data is not None and data.address else _EMPTY_ADDRESS
    lengths = np.diff(offsets).astype(np.uint64)
    addresses = offsets[:-1].astype(np.uint64) + np.uint64(base)
    if array.null_count:
        nulls = array.is_null().to_numpy(zero_copy_only=False)
        addresses[nulls] = 0
        lengths[nulls] = 0
    return addresses, lengths


_EMPTY = ctypes.create_string_buffer(1)
_EMPTY_ADDRESS = ctypes.addressof(_EMPTY)
