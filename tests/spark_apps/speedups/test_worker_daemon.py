"""The Python worker daemon drops Spark's archives from the path only when it is safe."""

from __future__ import annotations

import io
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from eop_spark.speedups import worker_daemon
from tests.spark_apps.kafka.test_client_config import make_config


def spark_home(root: Path) -> Path:
    (root / "python" / "lib").mkdir(parents=True)
    (root / "jars").mkdir()
    for archive in ("python/lib/pyspark.zip", "python/lib/py4j-src.zip", "jars/spark-core.jar"):
        (root / archive).write_bytes(b"PK")
    return root


def test_only_existing_archives_under_spark_home_count(tmp_path: Path) -> None:
    home = spark_home(tmp_path / "spark")
    (tmp_path / "user.zip").write_bytes(b"PK")
    path = [
        str(home / "python/lib/pyspark.zip"),
        str(home / "jars/spark-core.jar"),
        str(home / "python/lib/missing.zip"),
        str(tmp_path / "user.zip"),
        str(tmp_path),
    ]
    assert worker_daemon.spark_archives(path, str(home)) == path[:2]
    assert worker_daemon.spark_archives(path, None) == []


def test_archives_leave_the_path_when_pyspark_imports_without_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = spark_home(tmp_path / "spark")
    archive = str(home / "python/lib/pyspark.zip")
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.setattr(sys, "path", [archive, *sys.path])
    monkeypatch.setitem(sys.path_importer_cache, archive, None)
    assert worker_daemon.drop_spark_archives() == [archive]  # this venv has pyspark and py4j
    assert archive not in sys.path
    assert archive not in sys.path_importer_cache


def test_archives_stay_when_pyspark_lives_only_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = spark_home(tmp_path / "spark")
    archive = str(home / "python/lib/pyspark.zip")
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.setattr(sys, "path", [archive, str(tmp_path)])
    assert worker_daemon.drop_spark_archives() == []
    assert sys.path == [archive, str(tmp_path)]


def test_namespace_packages_found_in_an_archive_leave_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python 3.11's pickle tries `import org.python.core`; the spark-core jar has org/."""
    import importlib
    import zipfile
    import zipimport

    home = spark_home(tmp_path / "spark")
    jar = str(home / "jars/spark-core.jar")
    with zipfile.ZipFile(jar, "w") as archive:
        for entry in ("eopns/", "eopns/java/"):  # jars list their directories
            archive.writestr(entry, b"")
        archive.writestr("eopns/java/Thing.class", b"\xca\xfe")
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.setattr(sys, "path", [jar, *sys.path])
    monkeypatch.setattr(sys, "path_importer_cache", dict(sys.path_importer_cache))
    # The import system uses the interpreter's own module dict: clean up in it.
    for name in ("eopns", "eopns.python"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImportError):
        importlib.import_module("eopns.python.core")  # what pickle does with org.python.core
    assert "eopns" in sys.modules  # a namespace package made from the jar

    assert worker_daemon.drop_spark_archives() == [jar]

    assert "eopns" not in sys.modules
    importlib.invalidate_caches()
    with pytest.raises(ImportError):
        importlib.import_module("eopns.python.core")
    zip_importers = [
        key
        for key, finder in sys.path_importer_cache.items()
        if isinstance(finder, zipimport.zipimporter)
    ]
    assert zip_importers == []


def _zip_importers(_: object) -> Iterator[list[str]]:
    import zipimport

    cache = sys.path_importer_cache
    yield [key for key, finder in cache.items() if isinstance(finder, zipimport.zipimporter)]


def _worker_main(_: object) -> Iterator[str]:
    yield sys.modules["pyspark.worker"].main.__qualname__


@pytest.mark.spark
def test_real_python_workers_keep_no_importer_of_sparks_archives_and_ack_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each such importer costs every task a re-read of the archive (the spark-core jar);
    and the task runs in eop's quick-ACK reader, not pyspark's own (`acknowledging`)."""
    from eop_spark.runtime.session import build_session

    for name in ("PYTHONPATH", "PYSPARK_PYTHON", "SPARK_LOCAL_IP", "SPARK_HOME"):
        monkeypatch.delenv(name, raising=False)  # restored after the test; the session sets them
    spark = build_session(make_config(checkpointRoot=str(tmp_path)), [])
    try:
        found = spark.sparkContext.parallelize(range(2), 2).mapPartitions(_zip_importers).collect()
        mains = spark.sparkContext.parallelize(range(2), 2).mapPartitions(_worker_main).collect()
    finally:
        spark.stop()
    assert found == [[], []]
    assert mains == ["acknowledging.<locals>.worker_main"] * 2


def test_the_worker_module_is_the_one_pysparks_daemon_runs() -> None:
    assert worker_daemon.worker_module(["daemon.py", "pyspark.worker"]) == "pyspark.worker"
    assert worker_daemon.worker_module(["d", "pyspark.sql.worker.x"]) == "pyspark.sql.worker.x"
    assert worker_daemon.worker_module(["daemon.py"]) == "pyspark.worker"
    assert worker_daemon.worker_module(["daemon.py", "other"]) == "pyspark.worker"


def _tunables(_: object) -> Iterator[str | None]:
    import os

    yield os.environ.get("GLIBC_TUNABLES")


@pytest.mark.spark
def test_the_spark_jvm_and_its_workers_start_with_the_allocator_tunables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JVM keeps freed Arrow buffers (malloc_tuning); the runner's env stays as it was."""
    from eop_spark.runtime.session import build_session
    from eop_spark.speedups.malloc_tuning import TUNABLES_ENV, glibc_tunables

    for name in ("PYTHONPATH", "PYSPARK_PYTHON", "SPARK_LOCAL_IP", "SPARK_HOME", TUNABLES_ENV):
        monkeypatch.delenv(name, raising=False)
    spark = build_session(make_config(checkpointRoot=str(tmp_path)), [])
    try:
        # The workers fork from a daemon the JVM started: they have the JVM's environment.
        seen = spark.sparkContext.parallelize(range(1), 1).mapPartitions(_tunables).collect()
        jvm = spark.sparkContext._jvm.System.getenv(TUNABLES_ENV)  # type: ignore[union-attr]
    finally:
        spark.stop()
    assert seen == [glibc_tunables()]
    # (Not /proc/<pid>/environ: glibc cuts the original string at the first ':' as it parses.)
    assert jvm == glibc_tunables()
    assert TUNABLES_ENV not in os.environ


def _loopback_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    return client, accepted


@pytest.mark.skipif(worker_daemon.QUICKACK is None, reason="TCP_QUICKACK is Linux only")
def test_a_worker_reads_the_jvms_bytes_unchanged_and_acknowledges_at_once() -> None:
    """What pyspark's reader holds already comes first; then the socket, quick ACKs on."""
    jvm, worker = _loopback_pair()
    task = os.urandom(300_000)
    seen: list[tuple[bytes, int, int]] = []

    def main(infile: BinaryIO, outfile: BinaryIO) -> int:
        head = infile.read(5)
        rest = infile.read(len(task) - 3 - 5)
        with socket.socket(fileno=os.dup(worker.fileno())) as sock:
            quick = sock.getsockopt(socket.IPPROTO_TCP, worker_daemon.QUICKACK)
            nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        seen.append((head + rest, quick, nodelay))
        return 0

    with jvm, worker:
        # A request and an answer each way: Linux now delays this socket's ACKs.
        for _ in range(3):
            jvm.sendall(b"?")
            assert worker.recv(1) == b"?"
            worker.sendall(b"!")
            assert jvm.recv(1) == b"!"
        infile = os.fdopen(os.dup(worker.fileno()), "rb", 65536)
        jvm.sendall(task[:1000])
        assert infile.read(3) == task[:3]  # pyspark's reader now holds the rest of the 1000
        sender = threading.Thread(target=jvm.sendall, args=(task[1000:],))
        sender.start()
        assert worker_daemon.acknowledging(main)(infile, None) == 0
        sender.join()
        infile.close()
    assert seen == [(task[3:], 1, 1)]


def test_workers_on_other_sockets_read_as_pysparks_do(tmp_path: Path) -> None:
    """A Unix socket (or anything but TCP) gets pyspark's own reader."""
    left, right = socket.socketpair()
    with left, right:
        infile = os.fdopen(os.dup(right.fileno()), "rb", 65536)
        got = worker_daemon.acknowledging(lambda i, o: i)(infile, None)
        infile.close()
    assert got is infile
    assert worker_daemon.tcp_socket_of(io.BytesIO(b"")) is None
    path = tmp_path / "file"
    with path.open("wb") as regular:
        assert _descriptors_on(path) == 1
        assert worker_daemon.tcp_socket_of(regular) is None  # type: ignore[arg-type]
        assert _descriptors_on(path) == 1  # its duplicate closed again


def _descriptors_on(path: Path) -> int:
    """How many of this process's descriptors are open on ``path`` (other threads' come and go)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:  # closed meanwhile
            continue
    return count
