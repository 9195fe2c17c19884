"""The daemon Spark forks its Python workers from (``spark.python.daemon.module``).

It runs ``pyspark.daemon`` after three changes that cut the fixed cost of
every Python task (each micro-batch of the partitioned sink runs one per
source partition), and of every worker a restarted runner starts:

* Spark puts ``pyspark.zip``, the py4j zip and the ``spark-core`` jar first
  on the workers' ``PYTHONPATH``.  pyspark's worker calls
  ``importlib.invalidate_caches()`` before every task, and on Python 3.11 that
  re-reads the directory of every zip importer Python made, once per package
  imported from it: about half a second of CPU per task.  When pyspark and
  py4j are importable from elsewhere (a pip-installed pyspark ships the same
  modules in site-packages, with compiled bytecode), the archives are dropped
  from the path, with the importers and namespace packages made from them
  (importing :mod:`pickle` with the jar on the path makes one; left there, it took
  half the Python workers' CPU).
* The modules the sinks' tasks need (pyarrow, pandas, confluent-kafka,
  the sink code) are imported here once, so a forked worker starts with them.
* Everything imported is moved out of the garbage collector's sight
  (``gc.freeze``) before workers are forked: a reused worker runs a full
  ``gc.collect()`` after every task, which otherwise walks every object of
  those libraries each time.

* A worker acknowledges what it reads from the JVM at once (Linux's
  ``TCP_QUICKACK`` before and after every read of its socket) and sends its
  own small writes at once (``TCP_NODELAY``).  The JVM writes a task's
  header, its Arrow stream and its end in separate writes on a loopback TCP
  socket with Nagle's algorithm on, and a worker that only reads is in
  "delayed ACK" mode, so a write smaller than a segment (a small task's
  whole input, or the last bytes of a big one) waited for the kernel's 40 ms
  delayed-ACK timer: a job of 4 one-row tasks on 2 cores took ~130 ms,
  against ~45-60 ms with quick ACKs (``bench/python_tasks.py``).  Small
  tasks gain most; on the data-plane benchmark's 62,500-row tasks the gain
  for partitioned mode was within the noise (docs/performance.md).

Before the first worker it forks the executor's producer hub
(:mod:`eop_spark.speedups.producer_hub`), which keeps the partitioned sink's
producers whichever worker runs a partition's task.

The workers print their threads' stacks on SIGUSR1 (to stderr, which Spark
copies into the runner's), like the runner does.  The daemon itself does not:
a signal handler in it breaks pyspark's daemon loop, and the JVM then loses
its workers (measured: the query fails with "Connection refused").
"""

from __future__ import annotations

import faulthandler
import gc
import importlib
import io
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from importlib.machinery import PathFinder
from typing import Any, BinaryIO

from eop_spark.speedups import producer_hub
from eop_spark.speedups.malloc_tuning import keep_freed_memory

log = logging.getLogger(__name__)

#: Imported before workers are forked; optional (a missing one is skipped).
PRELOAD = (
    "pyarrow",
    "pyarrow.compute",
    "pandas",
    "confluent_kafka",
    "eop_spark.exactly_once.partitioned.task",
    "eop_spark.speedups.native_produce",
)


def spark_archives(path: list[str], spark_home: str | None) -> list[str]:
    """The zip and jar files of Spark's own installation on ``path``."""
    if not spark_home:
        return []
    home = os.path.join(os.path.realpath(spark_home), "")
    return [
        entry
        for entry in path
        if entry.endswith((".zip", ".jar"))
        and os.path.realpath(entry).startswith(home)
        and os.path.isfile(entry)
    ]


def drop_spark_archives() -> list[str]:
    """Take Spark's archives off ``sys.path`` if pyspark and py4j import without them."""
    archives = spark_archives(sys.path, os.environ.get("SPARK_HOME"))
    rest = [entry for entry in sys.path if entry not in archives]
    if not archives or any(PathFinder.find_spec(m, rest) is None for m in ("pyspark", "py4j")):
        return []
    sys.path[:] = rest
    inside = tuple(archives)
    # Namespace packages found in an archive while it was on the path (Python 3.11's pickle
    # tries `from org.python.core import ...`, and the spark-core jar has an org/ directory)
    # would keep a zip importer of it, which every task's invalidate_caches() re-reads.
    for name, module in list(sys.modules.items()):
        portions = list(getattr(module, "__path__", None) or [])
        namespace = getattr(module, "__file__", None) is None and portions
        if namespace and all(str(portion).startswith(inside) for portion in portions):
            del sys.modules[name]
    for key in [k for k in list(sys.path_importer_cache) if k.startswith(inside)]:
        del sys.path_importer_cache[key]
    return archives


def preload(modules: tuple[str, ...] = PRELOAD) -> None:
    """Import ``modules`` (the ones installed) so forked workers inherit them."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            log.debug("not preloading %s: %s", name, exc)


def _local_dir() -> str | None:
    """Spark's first local directory (the pod's scratch dir, emptied when a driver starts)."""
    first = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]
    return first if first and os.path.isdir(first) else None


#: Linux only; elsewhere the workers read as pyspark's do.
QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
#: Set to 1 in the workers' environment to read as pyspark's own workers do (to compare).
NO_QUICK_ACK_ENV = "EOP_NO_QUICK_ACK"
#: Set to 1 in the runner's environment to have Spark fork the workers from pyspark's own
#: daemon (to compare): none of this module's changes, no producer hub, no quick ACKs.
NO_WORKER_DAEMON_ENV = "EOP_NO_WORKER_DAEMON"


class QuickAckReads(io.RawIOBase):
    """A worker's input from the JVM, acknowledged to the kernel as soon as it is read.

    Reads go through ``infile`` (pyspark's buffered reader of the task's
    socket), so bytes it already holds come first; the socket is a duplicate
    of its descriptor, used only for socket options.
    """

    def __init__(self, infile: io.BufferedReader, sock: socket.socket) -> None:
        """Read from ``infile``; set ``TCP_QUICKACK`` on ``sock`` around each read."""
        super().__init__()
        self._infile = infile
        self._sock = sock

    def readable(self) -> bool:
        """Always: this is an input stream."""
        return True

    def readinto(self, buffer: Any) -> int:
        """One read of the underlying stream, with the kernel told to acknowledge at once."""
        self._quick_ack()
        count = self._infile.readinto1(buffer)
        self._quick_ack()  # Linux leaves quick-ACK mode again on its own
        return count

    def _quick_ack(self) -> None:
        assert QUICKACK is not None
        self._sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)

    def close(self) -> None:
        """Close the duplicate socket (pyspark's files close themselves)."""
        self._sock.close()
        super().close()


def tcp_socket_of(stream: BinaryIO) -> socket.socket | None:
    """A duplicate of ``stream``'s descriptor as a socket, if it is a TCP socket on Linux."""
    if QUICKACK is None:
        return None
    try:
        fd = os.dup(stream.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        return None
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        sock.close()
        return None
    return sock


def acknowledging(main: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """pyspark's ``worker.main(infile, outfile)``, reading through :class:`QuickAckReads`."""

    def worker_main(infile: Any, outfile: Any) -> Any:
        sock = None if os.environ.get(NO_QUICK_ACK_ENV) == "1" else tcp_socket_of(infile)
        if sock is None:
            return main(infile, outfile)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Bigger than pyspark's buffer: BufferedReader then reads it straight into ours.
        size = 2 * int(os.environ.get("SPARK_BUFFER_SIZE", 65536))
        with QuickAckReads(infile, sock) as raw:
            return main(io.BufferedReader(raw, size), outfile)

    return worker_main


def worker_module(argv: list[str]) -> str:
    """The module whose ``main`` pyspark's daemon runs in each worker, as the daemon finds it."""
    return argv[1] if len(argv) > 1 and argv[1].startswith("pyspark") else "pyspark.worker"


def _dump_stacks_on_sigusr1() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def main() -> None:
    """Prepare this process, then run pyspark's daemon (it forks the workers)."""
    os.register_at_fork(after_in_child=_dump_stacks_on_sigusr1)
    keep_freed_memory()  # inherited by every forked worker
    drop_spark_archives()
    preload()
    # The worker module pyspark's daemon runs (Spark names it in argv). Its `main` is wrapped
    # before pyspark.daemon is imported: Spark 4.0 takes `main` when the daemon is imported,
    # later releases import the module in each forked worker, and find this one, wrapped.
    worker: Any = importlib.import_module(worker_module(sys.argv))
    worker.main = acknowledging(worker.main)
    import pyspark.daemon

    gc.collect()
    gc.freeze()
    if producer_hub.enabled():
        hub = producer_hub.start(_local_dir())
        if hub is not None:
            os.environ[producer_hub.SOCKET_ENV] = hub  # inherited by every forked worker
    pyspark.daemon.manager()


if __name__ == "__main__":
    main()
