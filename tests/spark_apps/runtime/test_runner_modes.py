"""End to end on the real broker and real Spark: each commit mode, one run to the end."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devenv.runners import Pipeline, Runner, produce, read_committed_messages
from tests.plugins.kafka import TopicFactory
from tests.spark_apps.conftest import PipelineFactory

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


#: The partitioned tasks in Python workers (the JVM writer off), where the producer hub serves.
PYTHON_TASKS = {"EOP_NO_JVM_WRITER": "1"}


def run_to_the_end(
    pipeline: Pipeline, sql: str, env: dict[str, str] | None = None, **kafka: dict[str, Any]
) -> Runner:
    """Run ``sql`` over the input there is (availableNow) and check the runner exits 0.

    ``source``/``sink``: Kafka settings of that side (the broker is added).
    """
    servers = pipeline.broker.bootstrap_servers
    sections = {side: {"kafka": {"bootstrapServers": servers, **s}} for side, s in kafka.items()}
    config = pipeline.config(transform={"sql": sql}, trigger={"availableNow": True}, **sections)
    runner = pipeline.start(config, env=env)
    assert runner.wait(300) == 0, runner.tail()
    return runner


def test_partitioned_filter_commits_each_kept_record_once_and_g_reaches_the_end(
    make_pipeline: PipelineFactory,
) -> None:
    pipeline = make_pipeline()
    produce(
        pipeline.broker,
        pipeline.source_topic,
        ((f"k{i}", json.dumps({"id": i}), i % 4) for i in range(4000)),
    )
    # Partition 3 is filtered out entirely: G must still reach its end (driver commits).
    sql = "SELECT key, upper(CAST(value AS STRING)) AS value FROM source WHERE partition <> 3"
    runner = run_to_the_end(
        pipeline,
        sql,
        source={"topics": [pipeline.source_topic], "maxOffsetsPerTrigger": 1500},
    )

    keys = sorted(k.decode() for k, _ in pipeline.output() if k is not None)
    assert keys == sorted(f"k{i}" for i in range(4000) if i % 4 != 3)
    assert pipeline.progress() == pipeline.end_offsets()
    assert any("commit mode partitioned" in m for m in runner.messages())
    assert any("tasks commit in the executors' JVM" in m for m in runner.messages())
    assert {b["mode"] for b in runner.batches()} == {"partitioned"}
    assert sum(b["rows_in"] for b in runner.batches()) == 4000
    assert runner.stderr == ""


def test_partitioned_keeps_its_producers_from_batch_to_batch(
    make_pipeline: PipelineFactory,
) -> None:
    """No batch of a lone runner finds a producer fenced (the executor's hub holds them).

    Spark hands a partition's task to whichever Python worker is idle; with
    producers kept in the workers, one worker's producer took the id over from
    the other's, and that one counted as fenced at its next use.  (The tasks
    run in Python workers here: in the JVM writer no worker holds a producer.)
    """
    pipeline = make_pipeline()
    produce(
        pipeline.broker,
        pipeline.source_topic,
        ((f"k{i}", f"v{i}", i % 4) for i in range(4000)),
    )
    runner = run_to_the_end(
        pipeline,
        "SELECT key, value FROM source",
        PYTHON_TASKS,
        source={"topics": [pipeline.source_topic], "maxOffsetsPerTrigger": 500},
    )
    batches = runner.batches()
    assert len(batches) >= 8
    assert [b["fenced"] for b in batches] == [0] * len(batches)
    assert sorted(k.decode() for k, _ in pipeline.output() if k) == sorted(
        f"k{i}" for i in range(4000)
    )


def test_partitioned_copies_big_records_from_the_workers_whole_and_once(
    make_pipeline: PipelineFactory,
) -> None:
    """Tasks whose first Arrow batch is big produce in their own worker, not the hub.

    Every other batch here brings each task 270 records of 16 KiB (~4.4 MB in
    its first Arrow batch), so its worker commits with its own producer; the
    batches between bring 100-byte records, which go through the hub.  So a
    partition's id changes hands between the hub and the workers every batch:
    every record still arrives once, byte for byte, and those takeovers within
    the executor do not count as fencings.
    """
    pipeline = make_pipeline()
    per_batch = 4 * 270

    def value(i: int) -> str:
        return f"{i:08d}" * (2048 if i // per_batch % 2 == 0 else 12)

    records = 6 * per_batch
    produce(
        pipeline.broker,
        pipeline.source_topic,
        ((f"k{i}", value(i), i % 4) for i in range(records)),
    )
    runner = run_to_the_end(
        pipeline,
        "SELECT key, value FROM source",
        PYTHON_TASKS,
        source={"topics": [pipeline.source_topic], "maxOffsetsPerTrigger": per_batch},
    )

    output = sorted((k.decode(), v) for k, v in pipeline.output() if k is not None and v)
    assert output == sorted((f"k{i}", value(i).encode()) for i in range(records))
    assert pipeline.progress() == pipeline.end_offsets()
    batches = [b for b in runner.batches() if b["rows_in"]]
    assert [b["rows_in"] for b in batches] == [per_batch] * 6
    assert [b["fenced"] for b in batches] == [0] * 6


def test_partitioned_reads_several_topics_and_keeps_them_apart(
    make_pipeline: PipelineFactory, kafka_topic_factory: TopicFactory
) -> None:
    """Two source topics with the same partition numbers: each (topic, partition) commits alone.

    With one source topic the tasks' rows carry no topic column (the task knows it);
    with several they do, and G must end at every partition of both.
    """
    pipeline = make_pipeline(source_partitions=2)
    other = kafka_topic_factory(2, prefix="in2")
    for topic in (pipeline.source_topic, other):
        produce(pipeline.broker, topic, ((f"{topic}-{i}", "v", i % 2) for i in range(1000)))
    runner = run_to_the_end(
        pipeline,
        "SELECT key, value FROM source",
        source={"topics": [pipeline.source_topic, other], "maxOffsetsPerTrigger": 700},
    )

    keys = sorted(k.decode() for k, _ in pipeline.output() if k is not None)
    assert keys == sorted(f"{t}-{i}" for t in (pipeline.source_topic, other) for i in range(1000))
    ends = pipeline.end_offsets() | pipeline.end_offsets(other)
    assert pipeline.progress(pipeline.source_topic, other) == ends
    assert {b["mode"] for b in runner.batches()} == {"partitioned"}


@pytest.mark.parametrize("mode", ["coordinated", "partitioned"])
def test_each_record_arrives_whole_and_in_order(make_pipeline: PipelineFactory, mode: str) -> None:
    """Every output column reaches Kafka: key, headers, the target partition, in input order.

    The coordinated sink moves the output to the driver as Arrow batches; the
    partitioned sink's tasks send it from the executor's JVM (the Java
    producer). The record order of a source partition must survive either,
    and so must headers and a partition column.
    """
    pipeline = make_pipeline(source_partitions=2, sink_partitions=3)
    produce(
        pipeline.broker,
        pipeline.source_topic,
        ((f"k{i}", json.dumps({"id": i}), i % 2) for i in range(3000)),
    )
    sql = (
        "SELECT key, value, CAST(partition + 1 AS INT) AS partition, "
        "array(named_struct('key', 'src', 'value', CAST(CAST(offset AS STRING) AS BINARY))) "
        "AS headers FROM source"
    )
    runner = run_to_the_end(pipeline, sql, sink={"topic": pipeline.sink_topic, "commitMode": mode})

    by_partition: dict[int, list[tuple[int, int]]] = {}
    for message in read_committed_messages(pipeline.broker, pipeline.sink_topic):
        record = json.loads(message.value())
        assert message.key() == f"k{record['id']}".encode()
        assert message.headers() == [("src", str(record["id"] // 2).encode())]
        by_partition.setdefault(message.partition(), []).append(record["id"])
    # Source partition p went to sink partition p + 1, each record once, in source order.
    assert by_partition == {p + 1: list(range(p, 3000, 2)) for p in (0, 1)}
    assert pipeline.progress() == pipeline.end_offsets()
    assert {b["mode"] for b in runner.batches()} == {mode}
    assert runner.stderr == ""
