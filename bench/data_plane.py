"""Data-plane benchmark: how much exactly-once costs against Spark's own Kafka sink.

One broker, the same input for every contender (N records of 100 B and of 1 KiB
on 4 partitions), read with ``read_committed`` and written to a fresh topic by:

  (a) Spark's built-in Kafka sink (at-least-once),
  (b) eop, partitioned commit mode,
  (c) eop, coordinated commit mode,
  (d) the broker's ProducerPerformance tool: the ceiling for writing N records,
  (e) the Python produce path without exactly-once: the same rows handed to Python
      workers (``mapInArrow``, no ``foreachBatch``) and queued on librdkafka as
      partitioned mode's Python tasks do (:mod:`eop_spark.speedups.native_produce`), by a
      plain idempotent producer per task: no transactions, no progress group, no
      producer hub.  e/a is what moving the records through Python and librdkafka
      instead of the JVM's producer costs.  Partitioned mode's tasks run in the
      JVM by default (:mod:`eop_spark.exactly_once.partitioned.jvm_writer`), so b/e
      compares two paths, not exactly-once alone.

(a)-(c) and (e) run in one SparkSession (each first copies N 100-byte records twice, in
40 batches each, and then each size's input once, unmeasured, so the JIT of Spark's JVM
and of the broker has compiled what the measured rounds run), availableNow, N/4 offsets
per batch, the same producer batching (eop's defaults: linger.ms, batch.size). Two
figures each: N divided by the query's wall time (start-up included, from the moment the
stream is built: every contender's source stream and transform are analysed there, and
eop also takes its transactional ids over before Spark starts the query), and
N divided by the time of the batches themselves (the sum of Spark's ``triggerExecution``
over the batches that read rows: the rate a running pipeline sustains; the same measure
for every contender). Each of (a)-(c), (e) runs ``--rounds`` times, in a rotating order,
and keeps its best round: on a shared machine that filters out the moments another
process took the CPU, the same way for every contender (the targets were first read from
these; the paired table below is the stricter reading, and a target holds only if both
say so). A third table gives each contender's median round, to show how much a single
lucky round moves the best-of figures. A fourth pairs the contenders round by round: the
median over rounds of b/a measured within one round, seconds apart. On a machine whose
speed wanders (one host here ran the same contender at up to twice the rate from one
round to the next) the best round is whichever contender got lucky, and pairing cancels
what the rounds share. Eight rounds by default: with four contenders in a rotating
order, each runs first, second, third and last twice. For each contender's best round
the benchmark also prints the CPU it took: the broker's, and that of this process with
the Spark JVM and its Python workers. And each contender's median round's CPU without
the two JVMs' JIT compiler threads: what a copy costs once its code is compiled (each
round is a new query, and the compilers took 15-30 % of a round's CPU, more in one round
than the next), so the ratio of rates a machine with no CPU to spare gives. Then the
recovery time: a runner on a continuously fed topic is SIGKILLed (runner, JVM and Python
workers) and restarted at once; the time from the kill to the first batch the new runner
commits. Every copy is deleted once counted, so the page cache holds the input and a
copy or two, not the whole run. Runners map the JVM class archive as they do in the dev
environment and the image (built first if missing, see eop_spark.speedups.class_archive).

    .venv/bin/python -m bench.data_plane                  # 1,000,000 records, 15-30 min on 2 cores
    .venv/bin/python -m bench.data_plane --records 100000 # quick look

``--versus PYTHON`` measures two Spark releases side by side: PYTHON, the interpreter of
another virtualenv (another pyspark), runs the same contenders in a driver process of its
own on the same broker and input, each round right after this one's (which goes first
alternates); the tables come for each release, then the ratio of the two releases' rates
per contender, paired by round.

The figures, and how to read them: docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "spark_apps")]

from confluent_kafka import Producer  # noqa: E402

from devenv.kafka import PRODUCER_PERF_TOOL, KafkaBroker, spark_kafka_jars  # noqa: E402
from devenv.runners import Pipeline, end_offsets, read_committed  # noqa: E402
from eop_spark.contract.progress_names import ProgressNames  # noqa: E402
from eop_spark.contract.run_config import RunConfig  # noqa: E402
from eop_spark.exactly_once.progress_group import ProgressGroup  # noqa: E402
from eop_spark.kafka.client_config import (  # noqa: E402
    producer_config,
    sink_client_config,
    spark_source_options,
)
from eop_spark.runtime.class_archive_training import ensure_archive  # noqa: E402
from eop_spark.runtime.jars import connector_jars  # noqa: E402
from eop_spark.runtime.runner import PipelineRun  # noqa: E402
from eop_spark.runtime.session import build_session  # noqa: E402

PARTITIONS = 4
#: The contenders run through Spark: (a), (b), (c), (e).
MODES = ("builtin", "partitioned", "coordinated", "plain")
# The batching eop's producers use by default, given to every contender.
PRODUCER_TUNING = {
    key: str(value)
    for key, value in producer_config({}, "bench", 60_000).items()
    if key in ("linger.ms", "batch.size")
}


def fill(broker: KafkaBroker, topic: str, records: int, size: int) -> None:
    """Produce ``records`` keyed records of ``size`` bytes, round robin over the partitions."""
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 500_000,
        }
    )
    payloads = [os.urandom(size) for _ in range(64)]
    for i in range(records):
        while True:
            try:
                producer.produce(topic, payloads[i % 64], b"%08d" % i, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)


def run_config(
    broker: KafkaBroker,
    work: Path,
    name: str,
    source: str,
    sink: str,
    records: int,
    mode: str,
    *,
    batches: int = 4,
) -> RunConfig:
    """The run config of one eop contender: ``records`` in ``batches`` micro-batches."""
    servers = broker.bootstrap_servers
    return RunConfig.model_validate(
        {
            "pipeline": f"bench.{name}",
            "source": {
                "kafka": {
                    "bootstrapServers": servers,
                    "topics": [source],
                    "maxOffsetsPerTrigger": max(1, records // batches),
                }
            },
            "transform": {"sql": "SELECT key, value FROM source"},
            "sink": {
                "kafka": {
                    "bootstrapServers": servers,
                    "topic": sink,
                    "commitMode": mode,
                    "transactionTimeout": "300s",
                }
            },
            "trigger": {"availableNow": True},
            "transactionalIdPrefix": f"eop.bench.{name}",
            "progressGroup": f"eop.bench.{name}",
            "checkpointRoot": str(work / "checkpoints" / name),
        }
    )


#: The JVMs' JIT compiler threads, by the names /proc gives them (cut to 15 characters).
COMPILER_THREADS = ("C1 CompilerThre", "C2 CompilerThre")


def _stat(path: str) -> tuple[str, list[str]]:
    """The name and the fields after it of a /proc ``stat`` file."""
    text = Path(path).read_text()
    return text[text.index("(") + 1 : text.rindex(")")], text.rsplit(")", 1)[1].split()


def cpu_seconds(*roots: int) -> list[tuple[float, float]]:
    """CPU seconds of each root process with its live descendants (one /proc scan).

    For each root: user + system seconds of all its processes, and of their
    :data:`COMPILER_THREADS`.  A root below another root counts for itself
    only (the broker is a child of this process).
    """
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")

    def seconds(fields: list[str]) -> float:
        return (int(fields[11]) + int(fields[12])) / tick

    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat(f"/proc/{entry}/stat")[1]
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        times[int(entry)] = seconds(fields)

    def compilers(pid: int) -> float:
        total = 0.0
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    name, fields = _stat(f"/proc/{pid}/task/{tid}/stat")
                    total += seconds(fields) if name in COMPILER_THREADS else 0.0
        return total

    totals = []
    for root in roots:
        total, jit, stack = 0.0, 0.0, [root]
        while stack:
            pid = stack.pop()
            total += times.get(pid, 0.0)
            jit += compilers(pid)
            stack.extend(c for c in children.get(pid, []) if c not in roots)
        totals.append((total, jit))
    return totals


@dataclass(frozen=True)
class Timing:
    """How long a contender took: the query's wall time, and its batches' own time."""

    wall_s: float  # query start to end, start-up (planning, preparing the sink) included
    batches_s: float  # the sum of Spark's triggerExecution times of the batches that read rows

    def rate(self, records: int, *, sustained: bool = False) -> float:
        """Records/s over the wall time, or (``sustained``) over the batches' time."""
        return records / (self.batches_s if sustained else self.wall_s)


def round_ratios(numerator: list[float], denominator: list[float]) -> list[float]:
    """One contender's rate divided by another's in the same round, round by round."""
    return [n / d for n, d in zip(numerator, denominator, strict=True)]


def paired_ratio(numerator: list[float], denominator: list[float]) -> float:
    """The median over rounds of one contender's rate divided by another's in the same round.

    A round runs every contender back to back, so the two rates of a pair were measured
    seconds apart, under the same load on the machine; a round in which either was
    disturbed gives one outlying ratio, which the median drops.
    """
    return statistics.median(round_ratios(numerator, denominator))


def batch_seconds(query: Any) -> float:
    """Seconds Spark spent in the batches that read rows, from Spark's batch reports."""
    return sum(
        report["durationMs"].get("triggerExecution", 0) / 1000.0
        for report in query.recentProgress
        if report["numInputRows"] > 0
    )


def timed_eop(spark: Any, config: RunConfig) -> Timing:
    """How long eop takes to copy the topic."""
    topic = (config.source.kafka.topics or [""])[0]
    run = PipelineRun(config, threading.Event())
    started = time.monotonic()
    sink_conf = sink_client_config(config)
    # Source and sink are the one test broker: G under the source names, as a runner's
    # preflight (which the benchmark skips) finds from the two cluster ids.
    progress = ProgressGroup(ProgressNames(config.progress_group), sink_conf)
    query, gate = run.start_query(
        spark, [(topic, p) for p in range(PARTITIONS)], sink_conf, progress=progress
    )
    query.awaitTermination()
    elapsed = time.monotonic() - started
    if gate.failure is not None:
        raise gate.failure
    return Timing(elapsed, batch_seconds(query))


def timed_builtin(spark: Any, config: RunConfig) -> Timing:
    """How long Spark's own Kafka sink takes to copy the topic."""
    options = spark_source_options(config) | {"startingOffsets": "earliest"}

    def writer() -> Any:
        built = (
            spark.readStream.format("kafka")
            .options(**options)
            .load()
            .select("key", "value")
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", config.sink.kafka.bootstrap_servers)
            .option("topic", config.sink.kafka.topic)
            .option("checkpointLocation", config.checkpoint_location)
            .trigger(availableNow=True)
        )
        for key, value in PRODUCER_TUNING.items():
            built = built.option(f"kafka.{key}", value)
        return built

    return _timed(writer)


def _timed(writer: Callable[[], Any]) -> Timing:
    """Build a stream writer's query, start it, wait for it to end (availableNow); its timing.

    The clock starts before the query is built, as :func:`timed_eop`'s does: the
    source stream's and the transform's analysis is start-up for every contender.
    """
    started = time.monotonic()
    query = writer().start()
    query.awaitTermination()
    return Timing(time.monotonic() - started, batch_seconds(query))


def _produce_plainly(bootstrap_servers: str, topic: str) -> Any:
    """Contender (e)'s task function: queue a task's rows as partitioned mode does, no more."""

    def produce(batches: Iterator[Any]) -> Iterator[Any]:
        import confluent_kafka  # imported here: the worker unpickles this function

        from eop_spark.speedups import native_produce

        conf = producer_config({"bootstrap.servers": bootstrap_servers}, "-", 60_000)
        for transactional in ("transactional.id", "transaction.timeout.ms"):
            del conf[transactional]
        producer = confluent_kafka.Producer(conf)
        native = native_produce.attach(producer, None)
        if native is None:
            raise RuntimeError("librdkafka's produce_batch is not usable here")
        held = []  # librdkafka's records point into the batches until they are delivered
        for batch in batches:
            held.append(batch)
            key, value = batch.column("key"), batch.column("value")
            placed = native_produce.partitions(key, len(value), PARTITIONS, "murmur2_random")
            done = 0
            while done < len(value):
                queued, code = native.produce(topic, value, key, done, placed)
                done += queued
                if code == native_produce.ERR_QUEUE_FULL:
                    producer.poll(0.05)
                elif code:
                    raise RuntimeError(f"librdkafka refused a record: error {code}")
        if producer.flush(120):
            raise RuntimeError("records left undelivered")
        yield from ()

    return produce


def timed_plain(spark: Any, config: RunConfig) -> Timing:
    """How long eop's produce path takes to copy the topic without transactions."""
    from pyspark import cloudpickle

    module = sys.modules[__name__]
    if module.__name__ != "__main__":  # Python workers cannot import the benchmark
        cloudpickle.register_pickle_by_value(module)
    options = spark_source_options(config) | {"startingOffsets": "earliest"}
    produce = _produce_plainly(config.sink.kafka.bootstrap_servers, config.sink.kafka.topic)
    return _timed(
        lambda: (
            spark.readStream.format("kafka")
            .options(**options)
            .load()
            .select("key", "value")
            .mapInArrow(produce, "done long")
            .writeStream.format("noop")
            .option("checkpointLocation", config.checkpoint_location)
            .trigger(availableNow=True)
        )
    )


#: How each contender copies a topic (eop's commit modes: :func:`timed_eop`).
TIMED = {"builtin": timed_builtin, "plain": timed_plain}


def producer_perf(broker: KafkaBroker, topic: str, records: int, size: int) -> float:
    """Records/s of Kafka's ProducerPerformance tool writing the same volume."""
    props = [
        f"bootstrap.servers={broker.bootstrap_servers}",
        "acks=all",
        *(f"{k}={v}" for k, v in PRODUCER_TUNING.items()),
    ]
    result = broker.run_tool(
        PRODUCER_PERF_TOOL,
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--record-size",
        str(size),
        "--throughput",
        "-1",
        "--producer-props",
        *props,
        timeout=600,
        check=True,
    )
    match = re.findall(r"([0-9.]+) records/sec", result.stdout)
    if not match:
        raise RuntimeError(f"unexpected ProducerPerformance output:\n{result.stdout}")
    return float(match[-1])


def copy_count(broker: KafkaBroker, topic: str) -> int:
    """Records a read_committed reader sees in ``topic``."""
    return len(read_committed(broker, topic, timeout=600))


def measure_recovery(broker: KafkaBroker, work: Path, samples: int) -> list[float]:
    """Seconds from SIGKILL of a runner to the first batch its replacement commits."""
    pipeline = Pipeline(broker, work / "recovery", "rec-in", "rec-out")
    pipeline.work.mkdir(parents=True, exist_ok=True)
    broker.create_topic("rec-in", PARTITIONS)
    broker.create_topic("rec-out", PARTITIONS)
    stop = threading.Event()

    def feed() -> None:
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        i = 0
        while not stop.is_set():
            for _ in range(200):
                producer.produce("rec-in", b"x" * 100, b"%d" % i, partition=i % PARTITIONS)
                i += 1
            producer.poll(0)
            time.sleep(0.1)
        producer.flush(30)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    config = pipeline.config(trigger={"processingTime": "1s"})
    figures = []
    try:
        runner = pipeline.start(config)
        for _ in range(samples):
            runner.wait_batches(3, timeout=300)
            killed = time.time()
            runner.kill()
            runner = pipeline.start(config)
            runner.wait_batches(1, timeout=300)
            figures.append(runner.batches()[0]["committed_at"] - killed)
        runner.terminate()
        runner.wait(120)
    finally:
        stop.set()
        pipeline.cleanup()
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--sizes", default="100,1024", help="record sizes in bytes")
    parser.add_argument(
        "--rounds", type=int, default=8, help="runs per contender (a multiple of 4 is fair)"
    )
    parser.add_argument("--recovery-samples", type=int, default=2)
    parser.add_argument("--work", type=Path, help="work directory (default: a temp dir)")
    parser.add_argument(
        "--versus",
        metavar="PYTHON",
        help="another virtualenv's python (another pyspark): its contenders run side by side",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve()
    return in_work_dir(args, run_benchmark)


def in_work_dir(args: argparse.Namespace, run: Callable[[argparse.Namespace, Path], int]) -> int:
    """``run(args, work)`` in ``args.work``, or in a temporary directory removed after it."""
    work = args.work or Path(tempfile.mkdtemp(prefix="eop-bench-"))
    try:
        return run(args, work)
    finally:
        if args.work is None:  # the broker's logs alone take gigabytes
            shutil.rmtree(work, ignore_errors=True)


#: Unmeasured copies of the warm-up topic each contender makes before the measured rounds,
#: and the micro-batches of each: many batches make many requests, transactions and tasks.
WARM_UP_COPIES = 2
WARM_UP_BATCHES = 40


def warm_up_records(records: int) -> int:
    """Records of the warm-up topic (100 B each)."""
    return max(20_000, records)


#: The broker removes a deleted topic's files at once (Kafka waits a minute by default).
BROKER_OVERRIDES = {"log.segment.delete.delay.ms": "0"}


def disk_needed(records: int, sizes: list[int]) -> int:
    """Bytes the broker's log takes at most: every copy is deleted once it is counted.

    At a time: the input and two copies of it (one being written, the one before
    it perhaps still being removed), each record with its key and batch overhead
    (~40 bytes), of the largest size.
    """
    return records * (max(sizes) + 40) * 3


def drop(broker: KafkaBroker, topic: str) -> None:
    """Delete a topic the benchmark is done with.

    A million-record copy at 1 KiB writes a gigabyte; kept until the end, the
    run's ~30 GB filled the page cache in the 1 KiB rounds, and the kernel's
    writeback and reclaim took the CPU from whichever contender ran then.
    A deleted topic's dirty pages are dropped, never written.
    """
    broker.delete_topic(topic)


def copy_topic(
    driver: Driver,
    broker: KafkaBroker,
    work: Path,
    name: str,
    source: str,
    records: int,
    mode: str,
    *,
    batches: int = 4,
) -> Timing:
    """Copy ``source`` to a new topic ``out-<name>`` with contender ``mode``; its timing."""
    sink = f"out-{name}"
    broker.create_topic(sink, PARTITIONS)
    commit_mode = "auto" if mode in TIMED else mode
    config = run_config(broker, work, name, source, sink, records, commit_mode, batches=batches)
    return driver.copy(mode, config)


class Driver:
    """The Spark session the contenders run in: this process's."""

    def __init__(self, config: RunConfig) -> None:
        """Start the session (the connector jars and class archive of this pyspark)."""
        from importlib.metadata import version

        jars = connector_jars()  # this pyspark's release's
        if os.environ.get("EOP_SPARK_CLASS_ARCHIVE") is None:  # set: that archive, or none
            try:
                ensure_archive()
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:  # start-up only
                detail = getattr(exc, "stderr", None) or b""
                tail = detail[-2000:].decode(errors="replace") if isinstance(detail, bytes) else ""
                print(f"no JVM class archive, sessions start slower: {exc}\n{tail}", flush=True)
        self.spark = build_session(session_config(config), jars)
        self.spark.sparkContext.setLogLevel("ERROR")
        self.label = f"Spark {version('pyspark')}"
        self.pid = os.getpid()

    def copy(self, mode: str, config: RunConfig) -> Timing:
        """Run contender ``mode`` with ``config``; its timing."""
        return TIMED.get(mode, timed_eop)(self.spark, config)

    def stop(self) -> None:
        """Stop the session."""
        self.spark.stop()


class OtherDriver(Driver):
    """A session in a driver process of another Python (another pyspark): ``--versus``."""

    def __init__(self, config: RunConfig, python: str) -> None:
        """Start ``python -m bench.data_plane --serve`` and wait for its session."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "spark_apps")])}
        self.process = subprocess.Popen(
            [python, "-m", "bench.data_plane", "--serve"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.process.pid
        self.label = self._ask({"config": config.model_dump(mode="json", by_alias=True)})["label"]

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        print(json.dumps(request), file=self.process.stdin, flush=True)
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the --versus driver exited ({self.process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the --versus driver failed: {answer['error']}")
        return answer

    def copy(self, mode: str, config: RunConfig) -> Timing:
        """Run contender ``mode`` in the other driver; its timing."""
        answer = self._ask({"mode": mode, "config": config.model_dump(mode="json", by_alias=True)})
        return Timing(answer["wall_s"], answer["batches_s"])

    def stop(self) -> None:
        """Close its input: it stops its session and exits."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(120)


def serve() -> int:
    """``--serve``: the driver of ``--versus``. JSON lines in, JSON lines out on stdio.

    The first request carries the session's config and is answered with the release's
    label; each one after it, ``{"mode", "config"}``, with the copy's timing.
    """
    # Whatever else prints (this process, the Spark JVM it starts) goes to stderr, off the
    # answers: they go to a copy of the original stdout.
    sys.stdout.flush()
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    driver: Driver | None = None
    for line in sys.stdin:
        request = json.loads(line)
        config = RunConfig.model_validate(request["config"])
        try:
            if driver is None:
                driver = Driver(config)
                answer: dict[str, Any] = {"label": driver.label}
            else:
                timing = driver.copy(request["mode"], config)
                answer = {"wall_s": timing.wall_s, "batches_s": timing.batches_s}
        except Exception as exc:  # told to the benchmark, which stops
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), file=reply, flush=True)
    if driver is not None:
        driver.stop()
    return 0


#: Spark's checkpoint file manager on the FileSystem API before Spark 4.1 moved it into a
#: package of its own: what eop names (runtime.session) is the pinned release's.
OLD_FILE_SYSTEM_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager"
)


def session_config(seed: RunConfig) -> RunConfig:
    """The session's settings: a 4 GB driver, 4 shuffle partitions (and, for a ``--versus``
    pyspark before 4.1, its release's name of the checkpoint file manager eop sets)."""
    from importlib.metadata import version

    conf = {"spark.sql.shuffle.partitions": "4"}
    if tuple(int(part) for part in version("pyspark").split(".")[:2]) < (4, 1):
        conf["spark.sql.streaming.checkpointFileManagerClass"] = OLD_FILE_SYSTEM_CHECKPOINTS
    return seed.model_copy(
        update={
            "spark": seed.spark.model_copy(
                update={
                    "driver": seed.spark.driver.model_copy(update={"memory": "4g"}),
                    "conf": conf,
                }
            )
        }
    )


def run_benchmark(args: argparse.Namespace, work: Path) -> int:
    """Run every measurement in ``work`` and print the figures."""
    records = args.records
    sizes = sizes_of(args)
    work.mkdir(parents=True, exist_ok=True)
    needed, free = disk_needed(records, sizes), shutil.disk_usage(work).free
    if needed > free:
        # A full disk takes the broker's log directory offline: queries fail after minutes.
        print(
            f"the broker's topics need ~{needed / 1e9:.1f} GB in {work} but only "
            f"{free / 1e9:.1f} GB are free: free some space, or use --work on another disk "
            "or fewer --records",
            file=sys.stderr,
        )
        return 2
    print(
        f"eop data-plane benchmark: {records:,} records x {args.sizes} B, "
        f"{PARTITIONS} partitions, work dir {work}",
        flush=True,
    )

    with KafkaBroker(work / "kafka", heap="2g", overrides=BROKER_OVERRIDES) as broker:
        spark_kafka_jars()  # fetched if missing (the pinned release's)
        seed = run_config(broker, work, "session", "x", "y", records, "auto")
        # The other driver first: it must not inherit the environment this process's
        # session sets (SPARK_HOME, PYSPARK_PYTHON: its Python workers would be this pyspark's).
        drivers = [OtherDriver(seed, args.versus)] if args.versus else []
        try:
            drivers.insert(0, Driver(seed))
            measure(args, work, broker, drivers)
        finally:
            for driver in drivers:
                driver.stop()

        if args.recovery_samples:
            recovery = measure_recovery(broker, work, args.recovery_samples)
            shown = ", ".join(f"{r:.1f} s" for r in recovery)
            print(f"\nrecovery (SIGKILL -> first committed batch after restart): {shown}")
    return 0


@dataclass
class Rounds:
    """One Spark release's measured rounds of one record size, per contender."""

    walls: dict[str, list[float]]  # records/s, query start to end
    sustains: dict[str, list[float]]  # records/s while batches run
    cpu: dict[str, list[tuple[float, float]]]  # CPU seconds of the broker and of Spark
    work_cpu: dict[str, list[float]]  # the two together without the JIT compilers' threads

    @classmethod
    def empty(cls) -> Rounds:
        """No round yet."""
        return cls(
            {m: [] for m in MODES},
            {m: [] for m in MODES},
            {m: [] for m in MODES},
            {m: [] for m in MODES},
        )


def measure(
    args: argparse.Namespace, work: Path, broker: KafkaBroker, drivers: list[Driver]
) -> None:
    """Warm every driver up, run the rounds of each size, print the tables."""
    records = args.records
    assert broker.pid is not None
    # CPU of the broker, and of each driver with its JVM and Python workers.
    cpu_roots = (broker.pid, *(driver.pid for driver in drivers))

    # Warm-up, not measured: Python workers, connector classes, and the JIT of Spark's
    # JVM and of the broker, which a pipeline and a broker that have been up a while
    # have behind them. With -XX:+PrintCompilation both JVMs still compiled hundreds of
    # methods per million-record copy after two or three, and most were per-request and
    # per-batch code (the broker's KafkaApis.handle reached C2 in the fourth copy): that
    # code warms with the number of requests and batches, not of records, and
    # transactions make more kinds of requests, so the warm-up runs many small batches.
    warm = warm_up_records(records)
    broker.create_topic("warm-in", PARTITIONS)
    fill(broker, "warm-in", warm, 100)
    for at, driver in enumerate(drivers):
        for copy in range(WARM_UP_COPIES):
            for mode in MODES:
                name = f"warm-{mode}-{copy}-{at}"
                copy_topic(
                    driver, broker, work, name, "warm-in", warm, mode, batches=WARM_UP_BATCHES
                )
                drop(broker, f"out-{name}")
    drop(broker, "warm-in")

    measured: dict[int, list[Rounds]] = {}
    ceilings: dict[int, float] = {}
    for size in sizes_of(args):
        source = f"in-{size}"
        broker.create_topic(source, PARTITIONS)
        fill(broker, source, records, size)
        assert sum(end_offsets(broker, source).values()) == records
        measured[size] = [Rounds.empty() for _ in drivers]
        # One unmeasured copy of this size each: the warm-up above is of 100-byte
        # records, and without it every contender's 1 KiB rounds got faster one after
        # the other (Spark's sink 10.5 s in its first round, 6.9 s in its last).
        for at, driver in enumerate(drivers):
            for mode in MODES:
                name = f"warm-{mode}-{size}-{at}"
                copy_topic(driver, broker, work, name, source, records, mode)
                drop(broker, f"out-{name}")
        for round_ in range(args.rounds):
            turn = round_ % len(MODES)
            order = list(enumerate(drivers))
            for at, driver in order[round_ % 2 :] + order[: round_ % 2]:
                for mode in MODES[turn:] + MODES[:turn]:
                    name = f"{mode}-{size}-{round_}-{at}"
                    before = cpu_seconds(*cpu_roots)
                    timing = copy_topic(driver, broker, work, name, source, records, mode)
                    after = cpu_seconds(*cpu_roots)
                    spent = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before, strict=True)]
                    broker_cpu, spark_cpu = spent[0][0], spent[1 + at][0]
                    jit = spent[0][1] + spent[1 + at][1]
                    wall, sustained = timing.rate(records), timing.rate(records, sustained=True)
                    rounds = measured[size][at]
                    rounds.work_cpu[mode].append(broker_cpu + spark_cpu - jit)
                    rounds.cpu[mode].append((broker_cpu, spark_cpu))
                    rounds.walls[mode].append(wall)
                    rounds.sustains[mode].append(sustained)
                    written = copy_count(broker, f"out-{name}")
                    drop(broker, f"out-{name}")
                    print(
                        f"  {size:>5} B {mode:<12} round {round_} {driver.label:<11} "
                        f"{timing.wall_s:7.1f} s {wall:>10,.0f} rec/s; batches "
                        f"{timing.batches_s:5.1f} s {sustained:>10,.0f} rec/s; CPU s broker "
                        f"{broker_cpu:5.1f} spark {spark_cpu:5.1f}"
                        f"  (read_committed sees {written:,})",
                        flush=True,
                    )
        broker.create_topic(f"perf-{size}", PARTITIONS)
        ceilings[size] = producer_perf(broker, f"perf-{size}", records, size)
        drop(broker, f"perf-{size}")
        drop(broker, source)
        print(f"  {size:>5} B ProducerPerf {ceilings[size]:>18,.0f} rec/s", flush=True)

    for at, driver in enumerate(drivers):
        print_tables(
            driver.label if len(drivers) > 1 else "",
            {size: per_driver[at] for size, per_driver in measured.items()},
            ceilings,
        )
    if len(drivers) == 2:
        print_versus(drivers[1].label, drivers[0].label, measured)


def sizes_of(args: argparse.Namespace) -> list[int]:
    """The record sizes of ``--sizes``."""
    return [int(s) for s in args.sizes.split(",")]


def print_versus(other: str, this: str, measured: dict[int, list[Rounds]]) -> None:
    """Each contender's rate under one release divided by its rate under the other."""
    print(
        f"\n{other} / {this}: the median over rounds of one contender's rate under {other} "
        f"divided by its rate under {this} in the same round\n(query start to end; while "
        "batches run in brackets)\n"
        "                   (a) spark sink  (b) partitioned  (c) coordinated  (e) no transactions"
    )
    for size, (mine, theirs) in measured.items():
        cells = [
            f"{paired_ratio(theirs.walls[m], mine.walls[m]):.2f} "
            f"({paired_ratio(theirs.sustains[m], mine.sustains[m]):.2f})"
            for m in MODES
        ]
        print(f"{size:>5} B records  {cells[0]:>15} {cells[1]:>16} {cells[2]:>16} {cells[3]:>20}")


def print_tables(label: str, measured: dict[int, Rounds], ceilings: dict[int, float]) -> None:
    """The tables of one release's rounds (``label`` before each title when there are two)."""
    prefix = f"{label}: " if label else ""
    for title, pick in (
        ("records/s, query start to end", lambda r, m: max(r.walls[m])),
        ("records/s while batches run (Spark's triggerExecution)", lambda r, m: max(r.sustains[m])),
        (
            "records/s, query start to end, median round instead of best",
            lambda r, m: statistics.median(r.walls[m]),
        ),
    ):
        print(
            f"\n{prefix}{title}\n"
            "                   (a) spark sink  (b) partitioned  (c) coordinated  "
            "(d) producer perf  (e) no transactions   b/a   c/a   b/d   e/a   b/e"
        )
        for size, rounds in measured.items():
            a, b, c, e = (pick(rounds, m) for m in MODES)
            d = ceilings[size]
            print(
                f"{size:>5} B records  {a:>15,.0f} {b:>16,.0f} {c:>16,.0f} {d:>18,.0f}"
                f" {e:>20,.0f}  {b / a:4.2f}  {c / a:4.2f}  {b / d:4.2f}"
                f"  {e / a:4.2f}  {b / e:4.2f}"
            )

    print(
        f"\n{prefix}Paired: the median over rounds of the ratio of two contenders' rates in the "
        "same round\n(query start to end, and while batches run; per-round b/a in round order)\n"
        "                   b/a   c/a   e/a   b/e   b/a while batches run   b/a by round"
    )
    for size, rounds in measured.items():
        rates, busy = rounds.walls, rounds.sustains
        b_a = round_ratios(rates["partitioned"], rates["builtin"])
        print(
            f"{size:>5} B records  "
            + "  ".join(
                f"{paired_ratio(rates[n], rates[d]):4.2f}"
                for n, d in (
                    ("partitioned", "builtin"),
                    ("coordinated", "builtin"),
                    ("plain", "builtin"),
                    ("partitioned", "plain"),
                )
            )
            + f"   {paired_ratio(busy['partitioned'], busy['builtin']):20.2f}   "
            + " ".join(f"{r:4.2f}" for r in b_a)
        )

    print(
        f"\n{prefix}CPU seconds of each contender's best round (broker + Spark driver, JVM and "
        "Python workers)\n                   (a) spark sink  (b) partitioned  (c) coordinated"
        "  (e) no transactions"
    )
    for size, rounds in measured.items():
        best = {m: rounds.cpu[m][rounds.walls[m].index(max(rounds.walls[m]))] for m in MODES}
        cells = [f"{best[m][0]:5.1f} + {best[m][1]:5.1f}" for m in MODES]
        print(f"{size:>5} B records  {cells[0]:>15} {cells[1]:>16} {cells[2]:>16} {cells[3]:>20}")

    print(
        f"\n{prefix}CPU seconds per copy without the JIT compilers' threads (median round; "
        "broker, JVM and Python workers):\nwhat a copy costs once its code is compiled, and the "
        "ratio of rates a machine with no CPU to spare would give\n"
        "                   (a) spark sink  (b) partitioned  (c) coordinated"
        "  (e) no transactions   a/b   a/c   a/e   e/b"
    )
    for size, rounds in measured.items():
        a, b, c, e = (statistics.median(rounds.work_cpu[m]) for m in MODES)
        print(
            f"{size:>5} B records  {a:>15.1f} {b:>16.1f} {c:>16.1f} {e:>20.1f}"
            f"  {a / b:4.2f}  {a / c:4.2f}  {a / e:4.2f}  {e / b:4.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
