"""The producer hub: what a worker streams arrives whole, or nothing commits."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eop_spark.contract.errors import PipelineFailed, SinkRetryable
from eop_spark.exactly_once.partitioned.task import PartitionOutcome
from eop_spark.speedups import producer_hub

TP = ("in", 0)


@dataclass(frozen=True)
class Sink:
    """The one thing the hub asks of a task's sink settings."""

    prefix: str = "eop.test.p"

    def transactional_id(self, tp: tuple[str, int]) -> str:
        return f"{self.prefix}.out.{tp[1]}"


@dataclass(frozen=True)
class Task:
    sink: Sink = field(default_factory=Sink)


def batch(*values: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"value": list(values)})


def outcome(rows: int) -> PartitionOutcome:
    return PartitionOutcome("in", 0, "committed", rows, 1.0, 0, 0)


@dataclass
class Recorder:
    """A commit function that records what it saw; it commits only after reading everything."""

    committed: list[list[int]] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    fail_with: BaseException | None = None

    def __call__(self, task: Any, tp: Any, batches: Iterable[pa.RecordBatch]) -> PartitionOutcome:
        self.started.set()
        try:
            values: list[int] = []
            for each in batches:
                values += each.column("value").to_pylist()
                if self.fail_with is not None:
                    raise self.fail_with
            self.committed.append(values)  # the "commit": only after the whole stream
            return outcome(len(values))
        except BaseException as exc:
            self.failures.append(exc)
            raise
        finally:
            self.done.set()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Callable[[Recorder], str]]:
    """Serve a Hub with a given commit function on a Unix socket in this process."""
    listeners: list[socket.socket] = []

    def serve(recorder: Recorder) -> str:
        path = str(tmp_path / f"hub-{len(listeners)}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(8)
        listeners.append(listener)
        hub = producer_hub.Hub(listener, recorder)
        threading.Thread(target=hub.serve_forever, daemon=True).start()
        return path

    yield serve
    for listener in listeners:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()


def test_rows_reach_the_hub_whole_and_the_outcome_comes_back(hub: Any) -> None:
    recorder = Recorder()
    worker = producer_hub.HubConnection(hub(recorder))
    try:
        first = worker.commit(Task(), TP, [batch(1, 2), batch(3), batch(4, 5, 6)])
        second = worker.commit(Task(), TP, [batch(7)])  # the connection serves the next task
    finally:
        worker.close()
    assert recorder.committed == [[1, 2, 3, 4, 5, 6], [7]]
    assert first is not None and first.rows_out == 6
    assert second is not None and second.rows_out == 1


def test_the_hubs_error_is_raised_in_the_worker_and_the_connection_serves_on(hub: Any) -> None:
    recorder = Recorder(fail_with=PipelineFailed("sink topic 'out' does not exist"))
    worker = producer_hub.HubConnection(hub(recorder))
    try:
        with pytest.raises(PipelineFailed, match="sink topic 'out' does not exist"):
            worker.commit(Task(), TP, [batch(1), batch(2)])
        recorder.fail_with = None
        after = worker.commit(Task(), TP, [batch(3)])
    finally:
        worker.close()
    assert recorder.committed == [[3]] and after is not None


@pytest.mark.parametrize("end_of_stream", [True, False], ids=["arrow-eos", "no-eos"])
def test_a_stream_cut_short_never_commits(hub: Any, end_of_stream: bool) -> None:
    """A worker dying between two batches: even a well-formed Arrow stream is not enough."""
    recorder = Recorder()
    path = hub(recorder)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.connect(path)
        writer = raw.makefile("wb")
        producer_hub._send(writer, (Task(), TP))
        stream = pa.ipc.new_stream(writer, batch(1).schema)
        stream.write_batch(batch(1, 2))
        if end_of_stream:
            stream.close()
        writer.flush()
        writer.close()
    assert recorder.done.wait(10)
    assert recorder.committed == []
    assert len(recorder.failures) == 1 and isinstance(recorder.failures[0], SinkRetryable)


def test_a_newer_task_for_the_same_id_cuts_the_older_one_off(hub: Any) -> None:
    """A retried task's worker arrives while the stuck old one still streams: the new one wins."""
    recorder = Recorder()
    path = hub(recorder)
    old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old.connect(path)
    writer = old.makefile("wb")
    producer_hub._send(writer, (Task(), TP))
    stream = pa.ipc.new_stream(writer, batch(1).schema)
    stream.write_batch(batch(1, 2))
    writer.flush()
    assert recorder.started.wait(10)

    newer = producer_hub.HubConnection(path)
    try:
        result = newer.commit(Task(), TP, [batch(10), batch(11)])
    finally:
        newer.close()
    assert result is not None and result.rows_out == 2
    assert recorder.committed == [[10, 11]]  # the old task's rows never committed
    assert isinstance(recorder.failures[0], SinkRetryable)
    assert old.recv(1) == b""  # and the old worker finds its connection closed
    old.close()


def test_tasks_of_big_records_skip_the_hub_and_small_ones_take_it() -> None:
    """10,000 records of 100 bytes go through the hub; of 1 KiB, their worker produces."""
    small = pa.RecordBatch.from_pydict({"value": [b"x" * 100] * 10_000})
    big = pa.RecordBatch.from_pydict({"value": [b"x" * 1024] * 10_000})
    assert producer_hub.worth_the_hop(small)
    assert not producer_hub.worth_the_hop(big)


def test_a_fencing_by_another_process_of_the_executor_is_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Who last built a producer for an id tells Spark's scheduling from another runner."""
    monkeypatch.setenv(producer_hub.SOCKET_ENV, str(tmp_path / "hub.sock"))
    tid = "eop.ns.p.out.0"
    producer_hub.note_holder(tid)
    assert not producer_hub.handed_over_here(tid)  # still ours: a fencing is another runner
    # Another process of the executor (the hub, another worker) builds a producer for it.
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"from eop_spark.speedups import producer_hub; producer_hub.note_holder({tid!r})",
        ],
        check=True,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert producer_hub.handed_over_here(tid)
    assert not producer_hub.handed_over_here("eop.ns.p.out.1")  # nobody noted that one
    monkeypatch.delenv(producer_hub.SOCKET_ENV)
    assert not producer_hub.handed_over_here(tid)  # no hub, no notes: every fencing counts


def test_without_a_reachable_hub_the_worker_commits_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(producer_hub.SOCKET_ENV, str(tmp_path / "gone.sock"))
    monkeypatch.setattr(producer_hub, "_connection", None)
    monkeypatch.setattr(producer_hub, "_unreachable_logged", False)
    with caplog.at_level(logging.WARNING, logger=producer_hub.__name__):
        assert producer_hub.commit_via_hub(Task(), TP, [batch(1)]) is None  # type: ignore[arg-type]
        assert producer_hub.commit_via_hub(Task(), TP, [batch(2)]) is None  # type: ignore[arg-type]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "unreachable" in warnings[0]


def test_the_hub_process_leaves_with_its_parent_and_takes_its_socket_along(
    tmp_path: Path,
) -> None:
    """The hub is a forked child of Spark's worker daemon; it must not outlive it."""
    code = (
        "import sys, time\n"
        "from eop_spark.speedups import producer_hub\n"
        f"print(producer_hub.start({str(tmp_path)!r}), flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    try:
        assert parent.stdout is not None
        path = parent.stdout.readline().strip()
        assert path.startswith(str(tmp_path))
        assert os.stat(os.path.dirname(path)).st_mode & 0o077 == 0  # private to its user
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(path)  # the hub listens
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 15
    while os.path.exists(os.path.dirname(path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(os.path.dirname(path)), "the hub outlived its parent"


def test_a_deep_scratch_dir_moves_the_socket_to_the_temp_dir(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    private = producer_hub._private_dir(str(deep))
    try:
        assert not private.startswith(str(deep)) and list(deep.iterdir()) == []
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(os.path.join(private, "hub.sock"))
    finally:
        for leftover in Path(private).iterdir():
            leftover.unlink()
        os.rmdir(private)


def _hub_dir(parent: Path, name: str, *, age_s: float, listening: bool) -> tuple[Path, Any]:
    """A hub socket directory as a hub leaves it: its socket, listened on or dead."""
    directory = parent / f"eop-hub-{name}"
    directory.mkdir(mode=0o700)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(directory / "hub.sock"))
    if listening:
        server.listen(1)
    else:
        server.close()  # killed: the socket file stays, nobody accepts
    then = time.time() - age_s
    for path in (directory / "hub.sock", directory):
        os.utime(path, (then, then), follow_symlinks=False)
    return directory, server


def test_a_new_hub_sweeps_away_what_killed_hubs_left(tmp_path: Path) -> None:
    """SIGKILL leaves a hub's socket directory behind; the next daemon's hub removes it."""
    dead, _ = _hub_dir(tmp_path, "dead", age_s=3600, listening=False)
    alive, server = _hub_dir(tmp_path, "alive", age_s=3600, listening=True)
    starting, _ = _hub_dir(tmp_path, "starting", age_s=1, listening=False)
    unrelated = tmp_path / "eop-other"
    unrelated.mkdir()
    try:
        assert producer_hub.sweep(str(tmp_path)) == [str(dead)]
        assert not dead.exists()
        assert alive.exists() and starting.exists() and unrelated.exists()
    finally:
        server.close()
    # A hub that starts sweeps first (the live one above has just died).
    code = (
        "from eop_spark.speedups import producer_hub\n"
        f"print(producer_hub.start({str(tmp_path)!r}), flush=True)\n"
    )
    started = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert started.stdout.strip().startswith(str(tmp_path))
    assert not alive.exists() and starting.exists()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to hand a directory to another user")
def test_the_sweep_leaves_other_users_directories_alone(tmp_path: Path) -> None:
    theirs, _ = _hub_dir(tmp_path, "theirs", age_s=3600, listening=False)
    os.chown(theirs, 65534, 65534)
    assert producer_hub.sweep(str(tmp_path)) == []
    assert theirs.exists()
