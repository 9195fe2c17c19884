"""Drive real runner processes against a real broker, and read what readers see.

A :class:`Pipeline` owns a source and a sink topic, a work directory and a run
config; :meth:`Pipeline.start` launches ``python -m eop_spark run`` in a session
of its own (so a kill takes the JVM and the Python workers with it, as a
container kill does) and returns a :class:`Runner` that parses its JSON log.
The data-plane tests (``tests/spark_apps``) and the benchmark (``bench/``) use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from devenv.kafka import CONSUMER_GROUPS_TOOL, KafkaBroker, until_coordinator_ready
from devenv.kafka_cluster import KafkaCluster
from devenv.processes import QUICK_JVM_OPTIONS
from devenv.s3 import S3Server
from devenv.spark_home import shared_spark_home
from eop_spark.contract.run_config import SCRATCH_ENV

REPO = Path(__file__).resolve().parents[1]
SPARK_APPS = REPO / "spark_apps"

Offsets = dict[tuple[str, int], int]


class Brokers(Protocol):
    """Where a Kafka cluster listens: a :class:`KafkaBroker`, or a :class:`BrokerAddress`."""

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of its brokers."""
        ...


@dataclass(frozen=True)
class BrokerAddress:
    """A broker started elsewhere (by another process), known by its address only."""

    bootstrap_servers: str


#: Spark settings that keep a test runner small and quick on a 2-core machine.
TEST_SPARK: dict[str, Any] = {
    "master": "local[2]",
    "driver": {"memory": "1g"},
    "conf": {
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.streaming.minBatchesToRetain": "20",
    },
}


def runner_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a runner process: eop_spark and the test modules importable."""
    env = dict(os.environ)
    paths = [str(SPARK_APPS), str(REPO), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.pop("EOP_TERMINATION_LOG", None)
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a crash of the runner leaves a trace
    # The Spark driver's JVM (spark-submit adds these to its command line).
    env.setdefault("SPARK_SUBMIT_OPTS", " ".join(QUICK_JVM_OPTIONS))
    # spark-submit first runs a small JVM that builds the driver's command line: quick too.
    env.setdefault("SPARK_LAUNCHER_OPTS", " ".join(QUICK_JVM_OPTIONS))
    env.setdefault("SPARK_HOME", str(shared_spark_home()))  # the one its class archive fits
    env.update(extra or {})
    return env


class Runner:
    """One ``python -m eop_spark run`` process and its log."""

    def __init__(self, args: list[str], log_dir: Path, env: dict[str, str]) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        tag = f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.stdout_path = log_dir / f"runner-{tag}.out"
        self.stderr_path = log_dir / f"runner-{tag}.err"
        self.started = time.time()
        self._parsed_bytes = 0  # of stdout, by records()
        self._records: list[dict[str, Any]] = []
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "eop_spark", *args],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=REPO,
                start_new_session=True,
            )

    # -- log ----------------------------------------------------------------------------------

    def _stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def records(self) -> list[dict[str, Any]]:
        """The JSON log records written so far (other stdout lines, e.g. the JVM's, skipped).

        Only what was written since the last call is read and parsed: tests poll this many
        times a second while a runner logs thousands of lines.
        """
        with self.stdout_path.open("rb") as out:
            out.seek(self._parsed_bytes)
            new = out.read()
        complete = new.rfind(b"\n") + 1  # a line still being written waits for the next call
        self._parsed_bytes += complete
        for line in new[:complete].decode(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    self._records.append(json.loads(line))
        return list(self._records)

    def batches(self) -> list[dict[str, Any]]:
        """The per-batch log records."""
        return [r for r in self.records() if r.get("event") == "batch"]

    def messages(self) -> list[str]:
        """The text of every log record."""
        return [str(r.get("msg", "")) for r in self.records()]

    @property
    def stderr(self) -> str:
        """What the runner wrote on stderr."""
        return self.stderr_path.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        """The end of both outputs, for assertion messages."""
        out = self.stdout_path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(["--- stdout", *out, "--- stderr", self.stderr])

    # -- control ------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Whether the runner process still runs."""
        return self.proc.poll() is None

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout: float) -> None:
        """Poll ``predicate`` until true; fail (with the log) on timeout or an early exit."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if not self.alive:
                raise AssertionError(
                    f"runner exited ({self.proc.returncode}) before {what}\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                stacks = self.stacks()
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what}\n{self.tail()}\n{stacks}"
                )
            time.sleep(0.2)

    def stacks(self) -> str:
        """Where a stuck runner waits: its Python threads and the JVM's query threads.

        The runner and Spark's Python workers print their threads' stacks on
        SIGUSR1; the JVM's threads come from ``jcmd``, only those running a
        query or a task (Spark's JVM has dozens of idle ones).
        """
        if not self.alive:
            return ""
        before = len(self.stderr)
        before_out = len(self._stdout())
        pids = _session_pids(self.proc.pid)
        daemons = {pid for pid in pids if "worker_daemon" in _cmdline(pid)}
        # The runner and the workers (forked by a daemon); a daemon has no handler.
        for pid in [self.proc.pid, *(p for p in daemons if _parent(p) in daemons)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(1.0)
        # Workers write to the JVM's stderr, which is the runner's stdout.
        workers = [
            line for line in self._stdout()[before_out:].splitlines() if not line.startswith("{")
        ]
        parts = [
            "--- runner threads (SIGUSR1)",
            self.stderr[before:],
            "--- Python worker threads (SIGUSR1)",
            *workers,
        ]
        for pid in pids:
            if pid == self.proc.pid or "java" not in _cmdline(pid):
                continue
            dump = subprocess.run(
                ["jcmd", str(pid), "Thread.print"], capture_output=True, text=True, timeout=60
            ).stdout
            threads = dump.split("\n\n")
            busy = [t for t in threads if any(w in t for w in _JVM_THREADS)]
            parts += [f"--- JVM {pid} query and task threads (jcmd Thread.print)", *busy]
        return "\n".join(parts)

    def wait_batches(self, count: int, timeout: float = 180) -> None:
        """Wait until ``count`` batches are logged."""
        self.wait_for(f"{count} batches", lambda: len(self.batches()) >= count, timeout)

    def kill(self) -> None:
        """SIGKILL the runner with its JVM and Python workers, as a container kill does."""
        kill_session(self.proc.pid)
        self.proc.wait(30)

    def terminate(self) -> None:
        """SIGTERM the runner process only (as Kubernetes signals a container's main process)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 120) -> int:
        """Wait for the exit code (killing the group on timeout)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"runner did not exit within {timeout}s\n{self.tail()}") from None

    def cleanup(self) -> None:
        """Make sure nothing of this runner is left running."""
        if self.alive:
            self.kill()
        else:
            # The JVM or Python workers may outlive a runner that exited badly.
            kill_session(self.proc.pid)


#: JVM threads worth showing for a stuck runner: the query, its batches' tasks, py4j calls.
_JVM_THREADS = ("stream execution thread", "Executor task launch worker", "Thread-")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _session_pids(sid: int) -> list[int]:
    """The processes of session ``sid``: a runner, its JVM and the JVM's Python workers.

    pyspark's worker daemons put themselves in process groups of their own,
    so the runner's process group alone is not all of it.
    """
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ProcessLookupError):
                if os.getsid(int(entry.name)) == sid:
                    found.append(int(entry.name))
    return found


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid``, as a container kill does."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sid, signal.SIGKILL)  # the runner and its JVM: nothing forks after this
    for pid in _session_pids(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass(frozen=True)
class ObjectStoreCheckpoints:
    """Checkpoints in a bucket of the test S3 server instead of the work directory.

    A pipeline's root is ``s3a://<bucket>/<pipeline name>``; its runners get the
    server's ``fs.s3a.*`` settings as ``spark.hadoop.*`` (what ``checkpoint.options``
    becomes) and its credentials as environment variables (what ``checkpoint.secretRef``
    becomes in a driver pod).
    """

    server: S3Server
    bucket: str

    def root(self, pipeline: str) -> str:
        """The checkpoint root of ``pipeline``."""
        return f"s3a://{self.bucket}/{pipeline}"

    def spark_conf(self) -> dict[str, str]:
        """The Spark settings that reach the server."""
        return {f"spark.hadoop.{k}": v for k, v in self.server.hadoop_options().items()}

    def keys(self, pipeline: str) -> list[str]:
        """Every object under the pipeline's root, relative to it."""
        prefix = f"{pipeline}/"
        return [k[len(prefix) :] for k in self.server.list_keys(self.bucket, prefix)]

    def delete(self, pipeline: str) -> int:
        """Delete the pipeline's root (every generation); the number of objects deleted."""
        return self.server.delete_prefix(self.bucket, f"{pipeline}/")


@dataclass
class Pipeline:
    """One pipeline under test: topics, run config, runners, and output checks.

    The source topic is on ``broker`` (one broker, or a replicated :class:`KafkaCluster`);
    the sink topic on ``sink_broker`` when it is given (another Kafka cluster), else on
    ``broker`` too.
    """

    broker: KafkaBroker | KafkaCluster
    work: Path
    source_topic: str
    sink_topic: str
    name: str = field(default_factory=lambda: f"p{uuid.uuid4().hex[:8]}")
    runners: list[Runner] = field(default_factory=list)
    #: Where the checkpoints live: the work directory, or a bucket.
    object_store: ObjectStoreCheckpoints | None = None
    sink_broker: KafkaBroker | None = None

    @property
    def sink(self) -> KafkaBroker | KafkaCluster:
        """The broker of the sink topic, where G lives."""
        return self.sink_broker or self.broker

    @property
    def pipeline_id(self) -> str:
        """``<namespace>.<name>``."""
        return f"test.{self.name}"

    @property
    def group(self) -> str:
        """The progress group G."""
        return f"eop.{self.pipeline_id}"

    def config(self, **overrides: Any) -> dict[str, Any]:
        """The run config as JSON data; top-level keys in ``overrides`` replace the defaults."""
        bootstrap = self.broker.bootstrap_servers
        spark: dict[str, Any] = TEST_SPARK
        root = str(self.work / "checkpoints")
        if self.object_store is not None:
            spark = TEST_SPARK | {"conf": TEST_SPARK["conf"] | self.object_store.spark_conf()}
            root = self.object_store.root(self.name)
        config: dict[str, Any] = {
            "pipeline": self.pipeline_id,
            "source": {"kafka": {"bootstrapServers": bootstrap, "topics": [self.source_topic]}},
            "transform": {"sql": "SELECT key, value FROM source"},
            "sink": {
                "kafka": {"bootstrapServers": self.sink.bootstrap_servers, "topic": self.sink_topic}
            },
            "trigger": {"processingTime": "1s"},
            "spark": spark,
            "transactionalIdPrefix": self.group,
            "progressGroup": self.group,
            "checkpointRoot": root,
        }
        config.update(overrides)
        return config

    def write_config(self, config: Mapping[str, Any], name: str = "run.json") -> Path:
        """Write a run config into the work dir."""
        path = self.work / name
        path.write_text(json.dumps(config, indent=2))
        return path

    def start(
        self,
        config: Mapping[str, Any] | Path,
        *,
        generation: int | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Iterable[str] = (),
    ) -> Runner:
        """Start a runner on ``config`` (data or a written file)."""
        if isinstance(config, Path):
            path = config
        else:  # one file per start: concurrent runners must not read each other's config
            path = self.write_config(config, f"run-{len(self.runners)}.json")
        args = ["run", "--config", str(path), "--log-format", "json", *extra_args]
        if generation is not None:
            args += ["--generation", str(generation)]
        # Spark's scratch files (which a runner killed with SIGKILL leaves) go to the work
        # dir, not /tmp: one directory per runner, as two runners of a pipeline may run at once.
        scratch = {SCRATCH_ENV: str(self.work / "scratch" / f"runner-{len(self.runners)}")}
        if self.object_store is not None:
            scratch |= self.object_store.server.credentials_env()
        runner = Runner(args, self.work / "logs", runner_env({**scratch, **(env or {})}))
        self.runners.append(runner)
        return runner

    def cleanup(self) -> None:
        """Stop every runner this pipeline started."""
        for runner in self.runners:
            runner.cleanup()

    # -- Kafka views ------------------------------------------------------------------------

    def progress(self, *topics: str, stable: bool = True) -> Offsets:
        """G's stable committed offsets for the partitions of ``topics`` (the source topic).

        Read on the sink's cluster; when that is another cluster, under the
        progress topics ``<G>.progress.<topic>`` (docs/exactly-once.md).
        ``stable=False``: see :func:`committed_offsets`.
        """
        return self._progress_of(self._partitions(topics), stable=stable)

    def _progress_of(self, partitions: list[tuple[str, int]], *, stable: bool = True) -> Offsets:
        if self.sink_broker is None:
            return committed_offsets(self.broker, self.group, partitions, stable=stable)
        stored = {(f"{self.group}.progress.{t}", p): (t, p) for t, p in partitions}
        found = committed_offsets(self.sink_broker, self.group, list(stored), stable=stable)
        return {stored[tp]: offset for tp, offset in found.items()}

    def delete_progress(self, partition: int) -> None:
        """Delete G's committed offset of one source partition, as an expiry would (with
        Kafka's own tool, on the source's cluster)."""
        self.broker.run_tool(
            CONSUMER_GROUPS_TOOL,
            "--bootstrap-server",
            self.broker.bootstrap_servers,
            "--delete-offsets",
            "--group",
            self.group,
            "--topic",
            f"{self.source_topic}:{partition}",
            check=True,
        )

    def lag_view(self, *topics: str) -> Offsets:
        """G's offsets on the source's cluster for ``topics`` (the source topic): the lag view."""
        return committed_offsets(self.broker, self.group, self._partitions(topics))

    def _partitions(self, topics: tuple[str, ...]) -> list[tuple[str, int]]:
        """The partitions of ``topics`` (the source topic when none) on the source's cluster."""
        return [tp for topic in topics or (self.source_topic,) for tp in self.end_offsets(topic)]

    def end_offsets(self, topic: str | None = None) -> Offsets:
        """The source topic's end offsets (high watermarks)."""
        return end_offsets(self.broker, topic or self.source_topic)

    def caught_up(self) -> bool:
        """Whether G equals the source end offsets."""
        end = self.end_offsets()  # once: tests ask this many times a second
        return self._progress_of(list(end)) == end

    def output(self, topic: str | None = None) -> list[tuple[bytes | None, bytes | None]]:
        """Every (key, value) a read_committed reader sees in the sink topic."""
        return read_committed(self.sink, topic or self.sink_topic)


def committed_offsets(
    broker: Brokers, group: str, partitions: Iterable[tuple[str, int]], *, stable: bool = True
) -> Offsets:
    """``group``'s stable committed offsets on ``broker`` for ``partitions`` (absent: none).

    ``stable=False``: the offsets committed so far, without waiting for a transaction that
    holds offsets of the group to end (a killed runner's stays open until its ids are
    taken over or it times out).
    """
    # A consumer's committed() asks for stable offsets under read_committed (and, unlike
    # AdminClient.list_consumer_group_offsets in librdkafka 2.16, survives a fresh broker).
    isolation = "read_committed" if stable else "read_uncommitted"
    consumer = Consumer(
        client_config(broker, group_id=group, isolation_level=isolation, enable_auto_commit=False)
    )
    wanted = [TopicPartition(t, p) for t, p in partitions]
    try:
        found = until_coordinator_ready(lambda: consumer.committed(wanted, timeout=60))
        return {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}
    finally:
        consumer.close()


def client_config(broker: Brokers, **settings: Any) -> dict[str, Any]:
    """A confluent-kafka config for the test broker; ``linger_ms=5`` means ``linger.ms``."""
    return {"bootstrap.servers": broker.bootstrap_servers} | {
        key.replace("_", "."): value for key, value in settings.items()
    }


# Errors librdkafka reports while a partition's leader moves (not always flagged retriable).
_TRANSIENT = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
    }
)


def end_offsets(broker: Brokers, topic: str, timeout: float = 30) -> Offsets:
    """High watermarks of every partition of ``topic``.

    Retriable broker errors (a leader moving while the single broker restarts or a fresh topic's
    leader is still being elected) are retried until ``timeout``; anything else is raised.
    """
    consumer = Consumer(client_config(broker, group_id="eop-test-offsets"))
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                meta = consumer.list_topics(topic, timeout=10)
                return {
                    (topic, p): consumer.get_watermark_offsets(
                        TopicPartition(topic, p), timeout=10
                    )[1]
                    for p in meta.topics[topic].partitions
                }
            except KafkaException as exc:
                error = exc.args[0]
                transient = error.retriable() or error.code() in _TRANSIENT
                if not transient or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        consumer.close()


def read_committed(
    broker: Brokers, topic: str, timeout: float = 60
) -> list[tuple[bytes | None, bytes | None]]:
    """Read ``topic`` from the start to its end as a read_committed consumer: (key, value)s."""
    return [(m.key(), m.value()) for m in read_committed_messages(broker, topic, timeout)]


def read_committed_messages(broker: Brokers, topic: str, timeout: float = 60) -> list[Message]:
    """Read ``topic`` from the start to its end as a read_committed consumer: the messages."""
    ends = end_offsets(broker, topic)
    consumer = Consumer(
        client_config(
            broker,
            group_id=f"eop-test-reader-{uuid.uuid4().hex[:6]}",
            isolation_level="read_committed",
            enable_auto_commit=False,
            enable_partition_eof=True,
        )
    )
    records: list[Message] = []
    reached: dict[tuple[str, int], int] = {}
    try:
        consumer.assign([TopicPartition(t, p, 0) for (t, p) in ends])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for message in consumer.consume(10_000, 0.5):
                error = message.error()
                if error is None:
                    records.append(message)
                elif error.code() == KafkaError._PARTITION_EOF:
                    # EOF comes after markers and aborted records too: a sure end.
                    where = (str(message.topic()), int(message.partition() or 0))
                    reached[where] = int(message.offset() or 0)
            if all(reached.get(tp, -1) >= end for tp, end in ends.items()):
                return records
        raise AssertionError(f"could not read {topic} to its end {ends} within {timeout}s")
    finally:
        consumer.close()


def produce(
    broker: Brokers,
    topic: str,
    records: Iterable[tuple[str, str, int]],
) -> int:
    """Produce (key, value, partition) records, flushed; return how many."""
    producer = Producer(client_config(broker, linger_ms=20, compression_type="lz4"))
    count = 0
    for key, value, partition in records:
        while True:
            try:
                producer.produce(topic, value.encode(), key.encode(), partition=partition)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
    producer.flush(60)
    return count
