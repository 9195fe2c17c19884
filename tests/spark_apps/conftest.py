"""Fixtures for the data-plane tests: pipelines on the session broker, runners cleaned up."""

from __future__ import annotations

import signal
import subprocess
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devenv.kafka import KafkaBroker, spark_kafka_jars
from devenv.runners import ObjectStoreCheckpoints, Pipeline
from devenv.s3 import S3Server
from devenv.spark_home import shared_spark_home
from eop_spark.exactly_once.partitioned.jvm_writer import writer_jars
from eop_spark.runtime.class_archive_training import ensure_archive
from tests.plugins.kafka import TopicFactory

PipelineFactory = Callable[..., Pipeline]

#: The SIGINT handler before any test ran (Python's: Ctrl-C raises KeyboardInterrupt).
_SIGINT_HANDLER = signal.getsignal(signal.SIGINT)


@pytest.fixture(autouse=True)
def _ctrl_c_stops_the_run() -> Iterator[None]:
    """Put back the SIGINT handler after each test: a SparkContext in the test process (the
    tests' own sessions) installs one that cancels its jobs first, and once that context is
    stopped the handler fails and the KeyboardInterrupt never comes, so an interrupted run
    (Ctrl-C, or ``tests.lanes`` passing on a SIGTERM) would go on with its next test."""
    yield
    signal.signal(signal.SIGINT, _SIGINT_HANDLER)


@pytest.fixture(scope="session")
def spark_jars() -> Iterator[list[Path]]:
    """The Spark Kafka connector jars, fetched into the cache where the runner looks.

    Also builds partitioned mode's JVM writer, and the JVM class archive runners
    map (once per cache, for the cache's Spark home: devenv.spark_home; it saves
    each runner start seconds, see eop_spark.speedups.class_archive). The tests'
    own Spark sessions start from that Spark home too.
    """
    jars = spark_kafka_jars()
    writer_jars(jars)  # built now, not in the first runner a test times
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARK_HOME", str(shared_spark_home()))
        try:
            ensure_archive()
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:  # an optimisation
            warnings.warn(f"no JVM class archive, runners start slower: {exc}", stacklevel=1)
        yield jars


@pytest.fixture(scope="module")
def spark(spark_jars: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local session of the test process with the connector jars and the JVM writer (one
    per module: the tests of a module share its JVM)."""
    from eop_spark.runtime.session import build_session
    from tests.spark_apps.kafka.test_client_config import make_config

    session = build_session(
        make_config(checkpointRoot=str(tmp_path_factory.mktemp("ckpt"))), spark_jars
    )
    yield session
    session.stop()


@pytest.fixture
def s3_checkpoints(s3_server: S3Server, s3_bucket: str) -> ObjectStoreCheckpoints:
    """Checkpoints in a fresh bucket of the session S3 server: ``make_pipeline(object_store=)``."""
    return ObjectStoreCheckpoints(s3_server, s3_bucket)


@pytest.fixture
def make_pipeline(
    kafka_broker: KafkaBroker,
    kafka_topic_factory: TopicFactory,
    spark_jars: list[Path],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[PipelineFactory]:
    """``make_pipeline(source_partitions=4, sink_partitions=4)``: fresh topics and work dir.

    ``object_store=``: checkpoints in that bucket instead of the work dir.
    ``sink_broker=``: the sink topic (and G) on that broker, another Kafka cluster.
    A test (or a parameter of it) marked ``field_broker`` gets its pipelines on the
    ``field_broker`` (Kafka 3.x) instead of the session broker.
    """
    made: list[Pipeline] = []
    broker = (
        request.getfixturevalue("field_broker")
        if request.node.get_closest_marker("field_broker")
        else kafka_broker
    )

    def topic(on: KafkaBroker, partitions: int, prefix: str) -> str:
        if on is kafka_broker:
            return kafka_topic_factory(partitions, prefix=prefix)
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        on.create_topic(name, partitions)
        return name

    def make(
        source_partitions: int = 4,
        sink_partitions: int = 4,
        *,
        object_store: ObjectStoreCheckpoints | None = None,
        sink_broker: KafkaBroker | None = None,
    ) -> Pipeline:
        pipeline = Pipeline(
            broker=broker,
            work=tmp_path / f"pipeline-{len(made)}",
            source_topic=topic(broker, source_partitions, "in"),
            sink_topic=topic(sink_broker or broker, sink_partitions, "out"),
            object_store=object_store,
            sink_broker=sink_broker,
        )
        pipeline.work.mkdir(parents=True)
        made.append(pipeline)
        return pipeline

    yield make
    for pipeline in made:
        pipeline.cleanup()
