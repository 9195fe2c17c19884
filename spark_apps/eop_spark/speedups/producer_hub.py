"""The producer hub: one process per Spark executor holds the partitioned sink's producers.

Spark hands a task to whichever of its Python workers is idle, so the task of
source partition ``p`` often runs in another worker than in the batch before.
With producers kept in the workers, that worker's producer took
``<prefix>.<t>.<p>`` over (``init_transactions``), which fenced the producer
the other worker kept for it, and that one was rebuilt at its next use: in a
million-record copy in 4 batches the broker saw 15 ``InitProducerId`` for 16
transactions, each a new client, a connection and a wait of tens of
milliseconds in the task.  Measured side by side, producers that never trade
ids made partitioned mode ~5-8 % faster at 100-byte records.

So the worker daemon (:mod:`eop_spark.speedups.worker_daemon`) forks one more child
before any worker: this hub, which listens on a Unix socket in a private
directory (mode 0700) and keeps one producer per transactional id for as long
as the executor lives.  A task's worker reads its first Arrow batch, learns
its partition, and streams the batches to the hub (an Arrow IPC stream after
a small header); the hub runs the very steps a worker would
(:func:`eop_spark.exactly_once.partitioned.task.commit_partition`: take the id,
read G, skip or produce and commit) and sends the outcome, or the error, back.
The runner plugs the hub into the partitioned sink's tasks as their hand-off
(:class:`HubHandOff`); the exactly-once core does not know it exists.

Nothing about exactly-once depends on the hub: the ids still fence each other.
A worker that cannot reach it (no hub, a hub that died) uses its own producer
as before, which fences the hub's for that id.  Per transactional id the hub
serves one task at a time, and the newest wins, as with ``init_transactions``:
a second task for the same partition (a retried batch while a stuck task of
the old attempt still streams) shuts the older task's connection down, which
aborts its transaction, before it starts.

The hop costs a copy of every byte through the socket, and the hub reading
it: ~0.5 core-s per million 1 KiB records (side by side, 4-5 rounds each,
the workers' producers copied them 3-8 % faster in two runs).  A producer
that changes hands costs a new client and an ``init_transactions`` per
task, whatever its bytes.  So a task whose first Arrow batch holds
:data:`HOP_MAX_BYTES` or more (10,000 records of ~400 bytes with Spark's
Arrow batches) produces in its own worker (:func:`worth_the_hop`); at 100
bytes the two ways ran even.

Such a worker takes the id over from the hub or from another worker.  That
is Spark's scheduling, not another runner: each process of the executor that
builds a producer notes its pid under the id in the hub's directory
(:func:`note_holder`).  A process whose producer for the id is no longer the
noted one (:func:`handed_over_here`) builds a new one before its next
transaction instead of learning from the broker that it was fenced, and a
fencing counts only when no other process of this executor took the id over
since, so ``eop_producers_fenced_total`` still tells a zombie runner apart.

The hub exits with the daemon (``PR_SET_PDEATHSIG``), and so with the
executor.  A hub killed outright leaves its directory behind; the next one
to start removes those nobody listens on (:func:`sweep`).
``EOP_NO_PRODUCER_HUB=1`` keeps producers in the workers.

Longer than most modules: both ends of one wire format (the hub's server and
the workers' client) and the holder notes they share are kept in one place,
so a change to one end meets the other.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import pickle
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any, BinaryIO

from eop_spark.contract.errors import PipelineFailed, SinkRetryable
from eop_spark.contract.offsets import TopicPartition
from eop_spark.exactly_once.partitioned.task import (
    PartitionOutcome,
    PartitionTask,
    commit_partition,
)

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

log = logging.getLogger(__name__)

#: Where workers find the hub: the path of its socket (set by the worker daemon).
SOCKET_ENV = "EOP_PRODUCER_HUB"
#: Set (to anything but 0) to keep producers in the Python workers.
DISABLE_ENV = "EOP_NO_PRODUCER_HUB"

_HEADER = struct.Struct("!I")
_END = "end"  # the trailer after a task's Arrow stream: (_END, rows sent)
_PR_SET_PDEATHSIG = 1
_MAX_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
_DIR_PREFIX = "eop-hub-"
_SOCKET = "hub.sock"
_HOLDERS = "holders"
#: A dead hub's directory younger than this may be a starting hub's: it stays.
STALE_AFTER_S = 60.0
#: A task whose first Arrow batch holds this many bytes or more skips the hub.
HOP_MAX_BYTES = 4 * 1024 * 1024


def enabled() -> bool:
    """Whether the worker daemon should start a hub."""
    return os.environ.get(DISABLE_ENV, "") in ("", "0")


def worth_the_hop(first: pa.RecordBatch) -> bool:
    """Whether a task whose first Arrow batch is ``first`` should go through the hub.

    Not when that batch holds :data:`HOP_MAX_BYTES` or more: copying such a
    task's bytes to the hub costs more than its worker taking the
    transactional id over (see the module's docstring).
    """
    return bool(first.nbytes < HOP_MAX_BYTES)


def _holder_file(transactional_id: str) -> str | None:
    """Where this executor notes who holds ``transactional_id``; None without a hub."""
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return None
    name = hashlib.sha256(transactional_id.encode()).hexdigest()[:32]
    return os.path.join(os.path.dirname(path), _HOLDERS, name)


def note_holder(transactional_id: str) -> None:
    """Note that this process now holds ``transactional_id`` (its producer was just built)."""
    path = _holder_file(transactional_id)
    if path is None:
        return
    with contextlib.suppress(OSError):  # only a metric depends on it
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        temporary = f"{path}.{os.getpid()}"
        with open(temporary, "w") as out:
            out.write(str(os.getpid()))
        os.replace(temporary, path)


def handed_over_here(transactional_id: str) -> bool:
    """Whether another process of this executor took ``transactional_id`` over from this one.

    True when the hub or another Python worker built a producer for the id
    after this process did: the fencing this process just met is Spark's
    scheduling.  False otherwise, e.g. when another runner took it over.
    """
    path = _holder_file(transactional_id)
    if path is None:
        return False
    try:
        with open(path) as held:
            return held.read() != str(os.getpid())
    except OSError:
        return False


# ---------------------------------------------------------------------------- messages


def _send(stream: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the producer hub connection closed")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the producer hub connection closed mid-message")
    return pickle.loads(data)


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a PipelineFailed with its text."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return PipelineFailed(f"{type(error).__name__}: {error}")
    return error


# ---------------------------------------------------------------------------- the hub


class _Slots:
    """One active task per transactional id; a newer task shuts the older one's connection."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._holders: dict[str, socket.socket] = {}

    def acquire(self, key: str, connection: socket.socket) -> None:
        """Wait until ``key`` is free, shutting down the connection that holds it."""
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
            older = self._holders.get(key)
        if older is not None and older is not connection:
            with contextlib.suppress(OSError):  # its reads fail: the older task aborts
                older.shutdown(socket.SHUT_RDWR)
        lock.acquire()
        with self._guard:
            self._holders[key] = connection

    def release(self, key: str, connection: socket.socket) -> None:
        """Free ``key``."""
        with self._guard:
            if self._holders.get(key) is connection:
                del self._holders[key]
            self._locks[key].release()


def _arrow_batches(stream: BinaryIO) -> Iterator[pa.RecordBatch]:
    """A task's batches, then its trailer; raises if the stream was cut short.

    An Arrow stream that ends at a message boundary reads like a complete one,
    so a worker that died (or a connection shut by a newer task) between two
    batches would look like a partition with fewer rows.  Committing that
    would move G past rows never written: the trailer, sent after the stream,
    carries the row count, and nothing commits without it.
    """
    import pyarrow as pa

    rows = 0
    for batch in pa.ipc.open_stream(stream):
        rows += batch.num_rows
        yield batch
    try:
        trailer = _receive(stream)
    except EOFError as exc:
        raise SinkRetryable(f"a task's rows were cut short after {rows} rows: {exc}") from exc
    if trailer != (_END, rows):
        raise SinkRetryable(f"a task's stream ended with {trailer!r} after {rows} rows")


class Hub:
    """The server: a thread per worker connection, a producer per transactional id."""

    def __init__(
        self,
        listener: socket.socket,
        commit: Callable[[PartitionTask, TopicPartition, Iterable[Any]], PartitionOutcome],
    ) -> None:
        """Serve ``listener``; ``commit`` is the partitioned sink's commit_partition."""
        self.listener = listener
        self.commit = commit
        self.slots = _Slots()

    def serve_forever(self) -> None:
        """Accept worker connections until the listener is closed."""
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self.serve_connection, args=(connection,), daemon=True, name="eop-hub"
            ).start()

    def serve_connection(self, connection: socket.socket) -> None:
        """Serve one worker's tasks, one after the other, until it disconnects."""
        reader = connection.makefile("rb")
        writer = connection.makefile("wb")
        try:
            while True:
                try:
                    task, tp = _receive(reader)
                except Exception:  # disconnected, or shut down by a newer task
                    return
                if not self.serve_task(connection, reader, writer, task, tp):
                    return
        finally:
            for stream in (reader, writer):
                with contextlib.suppress(OSError):
                    stream.close()
            connection.close()

    def serve_task(
        self,
        connection: socket.socket,
        reader: BinaryIO,
        writer: BinaryIO,
        task: PartitionTask,
        tp: TopicPartition,
    ) -> bool:
        """Commit one task's partition from its stream; False when the connection is done."""
        key = task.sink.transactional_id(tp)
        self.slots.acquire(key, connection)
        batches = _arrow_batches(reader)
        try:
            reply: tuple[str, Any] = ("ok", self.commit(task, tp, batches))
        except BaseException as exc:
            reply = ("error", _portable(exc))
        finally:
            self.slots.release(key, connection)
        try:
            if reply[0] == "error":
                # The worker sends its whole stream before it reads the reply.
                deque(batches, maxlen=0)
            _send(writer, reply)
        except Exception:
            return False  # the worker is gone (or this task was superseded)
        return True


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the daemon died before prctl
        raise SystemExit(0)  # through start()'s clean-up


def _stop(*_: object) -> None:
    raise SystemExit(0)  # out of accept(), through start()'s clean-up


def _hub_main(listener: socket.socket, parent: int) -> None:
    """The hub process's life (a child forked from the worker daemon)."""
    signal.signal(signal.SIGTERM, _stop)  # before prctl: the parent's death cleans up too
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # pyspark's daemon SIGHUPs its group on exit
    _die_with_parent(parent)
    # fd 0 and 1 are the daemon's pipes to the JVM: keep them out of reach.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="eop hub: %(message)s")
    Hub(listener, commit_partition).serve_forever()


def _listening(path: str) -> bool:
    """Whether a process accepts connections on the Unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def sweep(directory: str | None, *, grace_s: float = STALE_AFTER_S) -> list[str]:
    """Remove the socket directories of dead hubs in ``directory``; return their paths.

    A hub removes its directory when it exits, but not when it is killed
    (SIGKILL of a runner's whole process group, an OOM kill), so on a
    long-lived machine they would pile up in the temp dir.  A directory goes
    when it is this user's and nobody listens on its socket; one younger than
    ``grace_s`` (by its own or its socket's time) may belong to a hub that
    is starting, and is left alone.
    """
    parent = directory or tempfile.gettempdir()
    removed: list[str] = []
    now = time.time()
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(_DIR_PREFIX):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            info = entry.stat(follow_symlinks=False)
            sock = os.path.join(entry.path, _SOCKET)
            youngest = max(info.st_mtime, os.lstat(sock).st_mtime if os.path.lexists(sock) else 0)
        except OSError:
            continue
        if info.st_uid != os.getuid() or now - youngest < grace_s or _listening(sock):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


def _private_dir(directory: str | None) -> str:
    """A new mode-0700 directory in ``directory``, or in the temp dir if its socket path
    would be too long there (a Unix socket's path has at most 107 bytes)."""
    private = tempfile.mkdtemp(prefix=_DIR_PREFIX, dir=directory)
    if directory is not None and len(os.path.join(private, _SOCKET).encode()) > _MAX_PATH:
        os.rmdir(private)
        private = tempfile.mkdtemp(prefix=_DIR_PREFIX)
    return private


def start(directory: str | None = None) -> str | None:
    """Fork the hub from this (single-threaded) process; return its socket path.

    The listening socket is bound before the fork, so workers can connect at
    once.  Returns None (producers stay in the workers) when it cannot start.
    """
    # Where hubs put their directories: the scratch dir, and the temp dir (the fallback).
    for place in {directory or tempfile.gettempdir(), tempfile.gettempdir()}:
        for stale in sweep(place):
            log.info("removed %s, left by a producer hub that was killed", stale)
    try:
        private = _private_dir(directory)
        path = os.path.join(private, _SOCKET)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(64)
    except OSError as exc:
        log.warning("producer hub not started (%s): producers stay in the Python workers", exc)
        return None
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.environ[SOCKET_ENV] = path  # as in the workers: where the executor notes holders
        try:
            _hub_main(listener, parent)
        finally:
            shutil.rmtree(private, ignore_errors=True)
            os._exit(0)
    listener.close()
    return path


# ---------------------------------------------------------------------------- workers


class HubConnection:
    """A worker's connection to the hub, reused by its tasks."""

    def __init__(self, path: str) -> None:
        """Connect to the hub at ``path`` (raises OSError if it does not answer)."""
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket.connect(path)
        self.reader = self.socket.makefile("rb")
        self.writer = self.socket.makefile("wb")

    def commit(
        self, task: PartitionTask, tp: TopicPartition, batches: Iterable[pa.RecordBatch]
    ) -> PartitionOutcome | None:
        """Stream ``tp``'s batches to the hub; its outcome, or its error raised here.

        None (nothing sent) when there are no batches: the caller commits those itself.
        """
        import pyarrow as pa

        remaining = iter(batches)
        first = next(remaining, None)
        if first is None:
            return None
        sent = False
        try:
            _send(self.writer, (task, tp))
            rows = 0
            with pa.ipc.new_stream(self.writer, first.schema) as stream:
                for batch in chain([first], remaining):
                    stream.write_batch(batch)
                    rows += batch.num_rows
            _send(self.writer, (_END, rows))
            sent = True
            status, value = _receive(self.reader)
        except (OSError, EOFError) as exc:
            raise SinkRetryable(
                f"the producer hub connection broke {'after' if sent else 'while'} "
                f"sending {tp[0]}-{tp[1]}: {exc}"
            ) from exc
        if status == "error":
            raise value
        outcome: PartitionOutcome = value
        return outcome

    def close(self) -> None:
        """Disconnect."""
        for closable in (self.reader, self.writer, self.socket):
            with contextlib.suppress(OSError):
                closable.close()


_connection: HubConnection | None = None
_unreachable_logged = False


def connection() -> HubConnection | None:
    """This worker's hub connection, or None when there is no hub to reach."""
    global _connection, _unreachable_logged
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return None
    if _connection is None:
        try:
            _connection = HubConnection(path)
        except OSError as exc:
            if not _unreachable_logged:
                log.warning("producer hub %s unreachable (%s): using this worker's", path, exc)
                _unreachable_logged = True
            return None
    return _connection


def commit_via_hub(
    task: PartitionTask, tp: TopicPartition, batches: Iterable[pa.RecordBatch]
) -> PartitionOutcome | None:
    """Commit ``tp``'s share of the batch through the hub; None when there is none to reach.

    Any failure while the stream is under way drops the connection (the hub
    then aborts the transaction); the next task connects again.
    """
    global _connection
    hub = connection()
    if hub is None:
        return None
    try:
        return hub.commit(task, tp, batches)
    except BaseException:
        hub.close()
        _connection = None
        raise


@dataclass(frozen=True)
class HubHandOff:
    """The hub as the partitioned tasks' hand-off (``TaskHandOff``), in any process.

    Plain data (pickled into the task function); what it does depends on the
    process: a worker forked by a daemon that started a hub finds it through
    :data:`SOCKET_ENV`, any other process (the driver, a worker without a hub)
    commits itself and notes nothing.
    """

    def commit(
        self,
        task: PartitionTask,
        tp: TopicPartition,
        first: pa.RecordBatch,
        batches: Iterable[pa.RecordBatch],
    ) -> PartitionOutcome | None:
        """Commit through the hub when the task is small enough (:func:`worth_the_hop`)."""
        if not worth_the_hop(first):
            return None
        return commit_via_hub(task, tp, batches)

    def note_holder(self, transactional_id: str) -> None:
        """:func:`note_holder`."""
        note_holder(transactional_id)

    def taken_over_here(self, transactional_id: str) -> bool:
        """:func:`handed_over_here`."""
        return handed_over_here(transactional_id)
