"""The partitioned sink's JVM task (jvm/PartitionedWriter.java) on the real broker and Spark.

The runner-level tests (test_runner_modes, test_recovery, test_chaos) run the
partitioned mode through it end to end; these call it directly, for what a
runner cannot easily provoke: a job without the batch's offsets, a job given
another batch's, and which sink settings keep the tasks in Python.
"""

from __future__ import annotations

import json
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devenv.kafka import KafkaBroker
from devenv.runners import client_config, read_committed
from eop_spark.contract.errors import PipelineFailed, from_failure
from eop_spark.contract.progress_names import ProgressNames
from eop_spark.exactly_once.batch_markers import batch_marker
from eop_spark.exactly_once.partitioned import jvm_writer
from eop_spark.exactly_once.partitioned.task import (
    BATCH_PROPERTY,
    SPARK_BATCH_PROPERTY,
    encode_batch,
)
from eop_spark.exactly_once.progress_group import ProgressGroup
from tests.plugins.kafka import TopicFactory

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

ROWS = "value binary, __eop_src_partition int, __eop_src_offset long"


def writer(spark: Any) -> Any:
    """The writer class through py4j."""
    found = spark.sparkContext._jvm
    for name in jvm_writer.CLASS.split("."):
        found = getattr(found, name)
    return found


def write(spark: Any, rows: list[tuple[bytes, int, int]], conf: str, **props: str) -> list[Any]:
    """Run the writer's job over ``rows`` with the local properties ``props``; its outcomes."""
    context = spark.sparkContext
    for key, value in props.items():
        context.setLocalProperty(key, value)
    try:
        df = spark.createDataFrame(rows, ROWS).repartition(1)
        return [json.loads(o) for o in writer(spark).write(df._jdf, conf)]
    finally:
        for key in props:
            context.setLocalProperty(key, None)


@dataclass(frozen=True)
class Pipe:
    """A source partition 0 of ``source``, a sink topic and a progress group G."""

    broker: KafkaBroker
    source: str
    sink: str
    group: str

    def settings(self, run: str = "run") -> str:
        """The settings JSON the partitioned sink gives the writer."""
        conf = {"bootstrap.servers": self.broker.bootstrap_servers}
        defaults = jvm_writer.producer_defaults(1 << 30, 4)
        producer = {**defaults, **conf, "enable.idempotence": "true"}
        return jvm_writer.writer_settings(self.sink, self.group, self.group, run, producer, conf)

    def batch(self, until: int, batch_id: int) -> str:
        """The BATCH_PROPERTY value of batch ``batch_id`` ending at ``until``."""
        return encode_batch({(self.source, 0): until}, batch_marker("q", batch_id))

    def output(self) -> list[bytes]:
        """The values a read_committed reader sees, sorted."""
        return sorted(v or b"" for _, v in read_committed(self.broker, self.sink))

    def markers(self, reads: int) -> list[dict[Any, str]]:
        """G's commit metadata for the source partition, read ``reads`` times."""
        group = ProgressGroup(ProgressNames(self.group), client_config(self.broker))
        try:
            return [group.read([(self.source, 0)]).metadata for _ in range(reads)]
        finally:
            group.close()

    def progress(self) -> dict[Any, int]:
        """G's committed offsets for the source partition."""
        group = ProgressGroup(ProgressNames(self.group), client_config(self.broker))
        try:
            return group.committed([(self.source, 0)])
        finally:
            group.close()


@pytest.fixture
def pipe(kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory) -> Pipe:
    """Fresh topics and group on the session broker."""
    source, sink = kafka_topic_factory(1, prefix="in"), kafka_topic_factory(1, prefix="out")
    return Pipe(kafka_broker, source, sink, f"eop.test.{uuid.uuid4().hex[:8]}")


def test_a_task_refuses_without_its_batch_or_with_another_batchs_offsets(
    spark: Any, pipe: Pipe
) -> None:
    rows = [(b"a", 0, 0), (b"b", 0, 1)]

    with pytest.raises(Exception) as missing:
        write(spark, rows, pipe.settings())
    with pytest.raises(Exception) as other:
        write(
            spark,
            rows,
            pipe.settings(),
            **{BATCH_PROPERTY: pipe.batch(2, 3), SPARK_BATCH_PROPERTY: "7"},
        )

    assert isinstance(from_failure(missing.value), PipelineFailed)
    assert BATCH_PROPERTY in str(from_failure(missing.value))
    assert "batch 7 was given the offsets of batch 3" in str(from_failure(other.value))
    assert pipe.output() == []
    assert pipe.progress() == {}


def test_a_batch_commits_once_and_its_replay_is_skipped(spark: Any, pipe: Pipe) -> None:
    rows = [(f"v{o}".encode(), 0, o) for o in range(5)]
    batch = {BATCH_PROPERTY: pipe.batch(5, 0)}

    first = write(spark, rows, pipe.settings(), **batch)
    again = write(spark, rows, pipe.settings(), **batch)
    # A new run (a restart) knows nothing and reads G: still a replay.
    restarted = write(spark, rows, pipe.settings(run="other"), **batch)

    assert [(o["status"], o["rows_out"], o["fenced"]) for o in first] == [("committed", 5, 0)]
    assert [o["status"] for o in again + restarted] == ["skipped", "skipped"]
    assert pipe.output() == [f"v{o}".encode() for o in range(5)]
    assert pipe.progress() == {(pipe.source, 0): 5}
    # The batch marker reads back exactly, as the runner reads it at every start. (Written
    # without a C string's NUL, confluent-kafka read on into whatever memory followed, and
    # a runner's start failed once in CI; that overread depends on the heap, so this
    # pins the format: the same bytes the librdkafka producers write.)
    assert pipe.markers(20) == [{(pipe.source, 0): batch_marker("q", 0)}] * 20


def prepare(spark: Any, pipe: Pipe, run: str) -> None:
    """What the runner does in local mode before the query starts: take the id, read G."""
    writer(spark).prepare(pipe.settings(run), json.dumps([[pipe.source, 0]]))


def test_a_prepared_run_resumes_where_g_ends(spark: Any, pipe: Pipe) -> None:
    rows = [(f"v{o}".encode(), 0, o) for o in range(5)]
    write(spark, rows[:3], pipe.settings("first"), **{BATCH_PROPERTY: pipe.batch(3, 0)})

    # A restart: its preparation reads G (3) for the first batch, which starts at 0 again.
    prepare(spark, pipe, "second")
    resumed = write(spark, rows, pipe.settings("second"), **{BATCH_PROPERTY: pipe.batch(5, 1)})

    assert [(o["status"], o["rows_out"], o["fenced"]) for o in resumed] == [("committed", 2, 0)]
    assert pipe.output() == [f"v{o}".encode() for o in range(5)]
    assert pipe.progress() == {(pipe.source, 0): 5}

    # A run that commits otherwise after all lets its producers go; a later task takes the id.
    writer(spark).release(pipe.group)
    again = write(spark, rows, pipe.settings("third"), **{BATCH_PROPERTY: pipe.batch(5, 1)})
    assert [o["status"] for o in again] == ["skipped"]


def test_a_prepared_producer_fenced_by_another_runner_is_rebuilt(spark: Any, pipe: Pipe) -> None:
    from eop_spark.kafka.transactional_producer import TransactionalProducer

    rows = [(f"v{o}".encode(), 0, o) for o in range(4)]
    prepare(spark, pipe, "run")
    write(spark, rows[:1], pipe.settings("run"), **{BATCH_PROPERTY: pipe.batch(1, 0)})
    # Another runner takes the id over (and would have committed had it had rows).
    TransactionalProducer(
        {**client_config(pipe.broker), "transactional.id": f"{pipe.group}.{pipe.source}.0"}
    ).close()

    outcomes = write(spark, rows, pipe.settings("run"), **{BATCH_PROPERTY: pipe.batch(4, 1)})

    assert [(o["status"], o["rows_out"], o["fenced"]) for o in outcomes] == [("committed", 3, 1)]
    assert pipe.output() == [f"v{o}".encode() for o in range(4)]


def test_librdkafka_only_security_settings_keep_the_tasks_in_python(spark: Any) -> None:
    shared = {"bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL", "linger.ms": "5"}
    java = jvm_writer.java_settings(spark, shared, 60_000, 4)
    assert java is not None
    producer, reader = java
    assert producer["security.protocol"] == reader["security.protocol"] == "SASL_SSL"
    assert producer["linger.ms"] == "5"  # the user's, over eop's default
    assert producer["transaction.timeout.ms"] == "60000"
    assert "linger.ms" not in reader  # a producer setting only

    # librdkafka's SASL user name has no Java client property: the Java client would
    # connect without credentials, so the tasks keep the librdkafka producers.
    assert jvm_writer.java_settings(spark, {**shared, "sasl.username": "u"}, 60_000, 4) is None
    # With the password and a mechanism the Java client logs in with, it gets them as JAAS.
    login = {"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}
    java = jvm_writer.java_settings(spark, {**shared, **login}, 60_000, 4)
    assert java is not None
    assert all("sasl.jaas.config" in c and "sasl.username" not in c for c in java)
    # A librdkafka tuning knob the Java client lacks is only left out.
    knob = {**shared, "queue.buffering.max.ms": "5"}
    assert jvm_writer.java_settings(spark, knob, 1, 4) is not None


def test_the_producers_buffers_keep_at_most_a_quarter_of_the_tasks_heap(spark: Any) -> None:
    # Each id's producer keeps what its buffer pool ever allocated, up to buffer.memory.
    shared = {"bootstrap.servers": "b:9092"}
    heap = jvm_writer.task_heap_bytes(spark)  # local mode: the driver's own heap
    assert heap == spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()
    for partitions in (1, 4, 64, 10_000):
        java = jvm_writer.java_settings(spark, shared, 60_000, partitions)
        assert java is not None
        memory, batch = int(java[0]["buffer.memory"]), int(java[0]["batch.size"])
        assert memory <= 32 << 20 and batch <= memory // 16
        assert partitions * memory <= heap // 4 or memory == 1 << 20  # the floor
    # Few partitions in a big heap: the Java producer's own default, eop's 1 MB batches.
    few = jvm_writer.producer_defaults(4 << 30, 4)
    assert few["buffer.memory"] == str(32 << 20) and few["batch.size"] == "1000000"
    # 16 partitions in 1 GiB: not the 512 MiB the default would let them keep.
    assert 16 * int(jvm_writer.producer_defaults(1 << 30, 16)["buffer.memory"]) <= 256 << 20
    # The user's setting wins.
    mine = jvm_writer.java_settings(spark, {**shared, "buffer.memory": "123456"}, 1, 10_000)
    assert mine is not None and mine[0]["buffer.memory"] == "123456"


def test_the_writer_is_built_once_per_source_and_skipped_without_a_jdk(
    spark_jars: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EOP_CACHE", str(tmp_path / "cache"))
    built = jvm_writer.writer_jars(spark_jars)
    assert [j.name for j in built] == [jvm_writer.jar_name()]
    with zipfile.ZipFile(built[0]) as jar:
        assert "io/exactlyonce/eop/PartitionedWriter.class" in jar.namelist()
    stamp = built[0].stat().st_mtime_ns

    monkeypatch.setenv("PATH", str(tmp_path / "no-jdk"))  # found, not built again
    assert jvm_writer.writer_jars(spark_jars) == built
    assert built[0].stat().st_mtime_ns == stamp

    monkeypatch.setenv("EOP_CACHE", str(tmp_path / "empty"))  # neither jar nor javac
    assert jvm_writer.writer_jars(spark_jars) == []
    monkeypatch.setenv(jvm_writer.NO_JVM_WRITER_ENV, "1")
    monkeypatch.setenv("EOP_CACHE", str(tmp_path / "cache"))
    assert jvm_writer.writer_jars(spark_jars) == []
