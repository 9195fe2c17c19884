"""A backlog that takes several transaction timeouts to write gets through, exactly once.

The broker here aborts a transaction within a quarter second of its timeout
(the default check runs every 10 s) and the sink's timeout is 1 s.  In
partitioned mode the transform takes ~70 us per record (a 1 ms sleep every
16th record), so each task writes its partition's share for several
timeouts; with no ``maxOffsetsPerTrigger`` the one batch is the whole
backlog, and it gets through only if no transaction lives as long as the
task.  In coordinated mode a batch is one transaction of the driver, and
with no ``maxOffsetsPerTrigger`` the runner bounds batches from the timeout;
a batch the spec lets grow past the timeout is reported as that.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devenv.kafka import KafkaBroker
from devenv.runners import TEST_SPARK, Pipeline, Runner, produce
from tests.spark_apps.runs import assert_exactly_once

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

#: Records per source partition: ~3-4 s of the slow transform each, several timeouts.
PER_PARTITION = 50_000
#: Keeps every record; sleeps 1 ms at every 16th (a void method's result reads "null").
SLOW_SQL = (
    "SELECT key, value FROM source WHERE offset % 16 <> 0 "
    "OR reflect('java.lang.Thread', 'sleep', CAST(1 AS BIGINT)) IS NOT NULL"
)
#: Coordinated mode: 2 partitions copied as they are; the default bound (33,333 records a
#: batch at a 1 s timeout) makes it 6 batches.
COORDINATED_PER_PARTITION = 100_000
#: A batch too big for the timeout: 8 partitions of 25,000 records behind a transform of ~32 us
#: a record (a 1 ms sleep every 32nd).  The driver fetches a batch's output one partition per
#: Spark job, two ahead, so its transaction spans the jobs of the other six: ~2.5 s.
TOO_BIG_PARTITIONS = 8
TOO_BIG_PER_PARTITION = 25_000
TOO_BIG_SQL = SLOW_SQL.replace("% 16", "% 32")
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


def backlog_pipeline(
    broker: KafkaBroker, tmp_path: Path, per_partition: int, partitions: int = 2
) -> Pipeline:
    """Source partitions holding the backlog (keys k0, k1, ...), an empty sink topic."""
    tag = uuid.uuid4().hex[:8]
    pipeline = Pipeline(
        broker=broker,
        work=tmp_path / "pipeline",
        source_topic=f"bl-in-{tag}",
        sink_topic=f"bl-out-{tag}",
    )
    broker.create_topic(pipeline.source_topic, partitions)
    broker.create_topic(pipeline.sink_topic, 2)
    pipeline.work.mkdir(parents=True)
    produce(
        broker,
        pipeline.source_topic,
        ((f"k{i}", f"v{i}", i % partitions) for i in range(partitions * per_partition)),
    )
    return pipeline


def start(
    pipeline: Pipeline,
    commit_mode: str,
    sql: str,
    env: dict[str, str] | None = None,
    spark_conf: dict[str, str] | None = None,
    source: dict[str, Any] | None = None,
) -> Runner:
    """Start a runner over the backlog (availableNow), with a 1 s transaction timeout."""
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
    config["source"]["kafka"].update(source or {})
    conf: dict[str, str] = {**TEST_SPARK["conf"], **(spark_conf or {})}  # type: ignore[dict-item]
    config["spark"] = {**TEST_SPARK, "conf": conf}
    return pipeline.start(config, env=env)


def catch_up(
    pipeline: Pipeline,
    commit_mode: str,
    sql: str,
    env: dict[str, str] | None = None,
    spark_conf: dict[str, str] | None = None,
) -> tuple[Runner, float]:
    """Run over the backlog with no maxOffsetsPerTrigger; the runner (exit 0) and its time."""
    started = time.monotonic()
    runner = start(pipeline, commit_mode, sql, env, spark_conf)
    try:
        code = runner.wait(CATCH_UP_S)
    finally:
        runner.cleanup()
    assert code == 0, runner.tail()
    return runner, time.monotonic() - started


def check_exactly_once(pipeline: Pipeline, took: float, records: int) -> None:
    """Every record once in the output, G at the source end, within :data:`CATCH_UP_S`."""
    assert_exactly_once(pipeline.output(), (f"k{i}" for i in range(records)))
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
@pytest.mark.slow
def test_partitioned_backlog_commits_in_several_transactions(
    quick_abort_broker: KafkaBroker,
    tmp_path: Path,
    env: dict[str, str],
    spark_conf: dict[str, str],
) -> None:
    pipeline = backlog_pipeline(quick_abort_broker, tmp_path, PER_PARTITION)
    try:
        runner, took = catch_up(pipeline, "partitioned", SLOW_SQL, env, spark_conf)
        check_exactly_once(pipeline, took, 2 * PER_PARTITION)
        # One batch of the whole backlog: nothing bounded it.
        assert [(b["mode"], b["rows_in"]) for b in runner.batches()] == [
            ("partitioned", 2 * PER_PARTITION)
        ]
    finally:
        pipeline.cleanup()


@pytest.mark.slow
def test_coordinated_backlog_is_read_in_batches_the_timeout_allows(
    quick_abort_broker: KafkaBroker, tmp_path: Path
) -> None:
    pipeline = backlog_pipeline(quick_abort_broker, tmp_path, COORDINATED_PER_PARTITION)
    records = 2 * COORDINATED_PER_PARTITION
    try:
        runner, took = catch_up(pipeline, "coordinated", "SELECT key, value FROM source")
        check_exactly_once(pipeline, took, records)
        # 1 s of timeout: at most 33,333 records a batch (a third of it at 100,000 a second).
        batches = runner.batches()
        assert {b["mode"] for b in batches} == {"coordinated"}
        ends = [sum(json.loads(b["offsets"])[pipeline.source_topic].values()) for b in batches]
        sizes = [end - before for before, end in zip([0, *ends], ends, strict=False)]
        assert sum(sizes) == records
        assert max(sizes) <= 33_333, sizes
    finally:
        pipeline.cleanup()


@pytest.mark.slow
def test_a_batch_too_big_for_the_timeout_is_reported_as_that(
    quick_abort_broker: KafkaBroker, tmp_path: Path
) -> None:
    """The spec's own maxOffsetsPerTrigger lets one coordinated batch outlive the timeout."""
    pipeline = backlog_pipeline(
        quick_abort_broker, tmp_path, TOO_BIG_PER_PARTITION, TOO_BIG_PARTITIONS
    )
    try:
        runner = start(
            pipeline, "coordinated", TOO_BIG_SQL, source={"maxOffsetsPerTrigger": 1_000_000}
        )
        try:
            code = runner.wait(CATCH_UP_S)
        finally:
            runner.cleanup()
        assert code != 0
        line = runner.stderr.strip().splitlines()[-1]
        assert line.startswith("eop: error: [Failed] the transaction of "), line
        assert "longer than sink.kafka.transactionTimeout (1000 ms)" in line
        assert "source.kafka.maxOffsetsPerTrigger" in line
        assert pipeline.output() == []
        assert pipeline.progress() == {}
    finally:
        pipeline.cleanup()
