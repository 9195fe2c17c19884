"""A backlog that takes several transaction timeouts to write gets through, exactly once.

The broker here aborts a transaction within a quarter second of its timeout
(the default check runs every 10 s), the sink's timeout is 1 s, and the
transform takes ~70 us per record (a 1 ms sleep every 16th record), so
writing one partition's share of the backlog takes several timeouts.  With
no ``maxOffsetsPerTrigger`` the first batch is the whole backlog: it gets
through only if no transaction lives as long as the batch.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devenv.kafka import KafkaBroker
from tests.spark_apps.harness import (
    TEST_SPARK,
    Pipeline,
    Runner,
    assert_exactly_once,
    produce,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

#: Records per source partition: ~3-4 s of the slow transform each, several timeouts.
PER_PARTITION = 50_000
#: Keeps every record; sleeps 1 ms at every 16th (a void method's result reads "null").
SLOW_SQL = (
    "SELECT key, value FROM source WHERE offset % 16 <> 0 "
    "OR reflect('java.lang.Thread', 'sleep', CAST(1 AS BIGINT)) IS NOT NULL"
)
#: Coordinated mode: records per partition, and a transform at ~16 us per record (a 1 ms sleep
#: every 64th), about the driver's own rate: one batch of it all takes ~3 s to write.
COORDINATED_PER_PARTITION = 100_000
COORDINATED_SQL = SLOW_SQL.replace("% 16", "% 64")
#: The bound: a runner's start (~20-30 s on 2 cores) and the backlog, with room to spare.
CATCH_UP_S = 150


@pytest.fixture(scope="module")
def quick_abort_broker(
    tmp_path_factory: pytest.TempPathFactory, spark_jars: list[Path]
) -> Iterator[KafkaBroker]:
    """A broker that aborts timed-out transactions within 250 ms of their timeout."""
    overrides = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "250"}
    with KafkaBroker(
        tmp_path_factory.mktemp("kafka-quick-abort"), heap="512m", overrides=overrides
    ) as broker:
        yield broker


def backlog_pipeline(broker: KafkaBroker, tmp_path: Path, per_partition: int) -> Pipeline:
    """Two source partitions holding the backlog, an empty sink topic."""
    tag = uuid.uuid4().hex[:8]
    pipeline = Pipeline(
        broker=broker,
        work=tmp_path / "pipeline",
        source_topic=f"bl-in-{tag}",
        sink_topic=f"bl-out-{tag}",
    )
    broker.create_topic(pipeline.source_topic, 2)
    broker.create_topic(pipeline.sink_topic, 2)
    pipeline.work.mkdir(parents=True)
    produce(
        broker,
        pipeline.source_topic,
        ((f"k{i}", f"v{i}", i % 2) for i in range(2 * per_partition)),
    )
    return pipeline


def catch_up(
    pipeline: Pipeline,
    commit_mode: str,
    sql: str,
    env: dict[str, str] | None = None,
    spark_conf: dict[str, str] | None = None,
) -> tuple[Runner, float]:
    """Run over the backlog (availableNow, no maxOffsetsPerTrigger); the runner and its time."""
    servers = pipeline.broker.bootstrap_servers
    config: dict[str, Any] = pipeline.config(
        transform={"sql": sql},
        trigger={"availableNow": True},
        sink={
            "kafka": {
                "bootstrapServers": servers,
                "topic": pipeline.sink_topic,
                "transactionTimeout": "1s",
                "commitMode": commit_mode,
            }
        },
    )
    conf: dict[str, str] = {**TEST_SPARK["conf"], **(spark_conf or {})}  # type: ignore[dict-item]
    config["spark"] = {**TEST_SPARK, "conf": conf}
    started = time.monotonic()
    runner = pipeline.start(config, env=env)
    try:
        code = runner.wait(CATCH_UP_S)
    finally:
        runner.cleanup()
    assert code == 0, runner.tail()
    return runner, time.monotonic() - started


def check_exactly_once(pipeline: Pipeline, took: float, per_partition: int) -> None:
    """Every record once in the output, G at the source end, within :data:`CATCH_UP_S`."""
    assert_exactly_once(pipeline.output(), (f"k{i}" for i in range(2 * per_partition)))
    assert pipeline.progress() == pipeline.end_offsets()
    assert took < CATCH_UP_S


@pytest.mark.parametrize(
    ("env", "spark_conf"),
    [
        pytest.param({}, {}, id="jvm-writer"),
        # Python tasks look at the clock once per Arrow batch: ~140 ms of this transform each.
        pytest.param(
            {"EOP_NO_JVM_WRITER": "1"},
            {"spark.sql.execution.arrow.maxRecordsPerBatch": "2000"},
            id="python-tasks",
        ),
    ],
)
def test_partitioned_backlog_commits_in_several_transactions(
    quick_abort_broker: KafkaBroker,
    tmp_path: Path,
    env: dict[str, str],
    spark_conf: dict[str, str],
) -> None:
    pipeline = backlog_pipeline(quick_abort_broker, tmp_path, PER_PARTITION)
    try:
        runner, took = catch_up(pipeline, "partitioned", SLOW_SQL, env, spark_conf)
        check_exactly_once(pipeline, took, PER_PARTITION)
        # One batch of the whole backlog: nothing bounded it.
        assert [(b["mode"], b["rows_in"]) for b in runner.batches()] == [
            ("partitioned", 2 * PER_PARTITION)
        ]
    finally:
        pipeline.cleanup()


def test_coordinated_backlog_is_read_in_batches_the_timeout_allows(
    quick_abort_broker: KafkaBroker, tmp_path: Path
) -> None:
    pipeline = backlog_pipeline(quick_abort_broker, tmp_path, COORDINATED_PER_PARTITION)
    try:
        runner, took = catch_up(pipeline, "coordinated", COORDINATED_SQL)
        check_exactly_once(pipeline, took, COORDINATED_PER_PARTITION)
        # 1 s of timeout: at most 33,333 records a batch (a third of it at 100,000 a second).
        batches = [b for b in runner.batches() if b["rows_in"]]
        assert {b["mode"] for b in batches} == {"coordinated"}
        assert max(b["rows_in"] for b in batches) <= 33_333
        assert sum(b["rows_in"] for b in batches) == 2 * COORDINATED_PER_PARTITION
    finally:
        pipeline.cleanup()
