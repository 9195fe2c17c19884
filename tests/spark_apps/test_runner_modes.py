"""End to end on the real broker and real Spark: each commit mode, one run to the end."""

from __future__ import annotations

import json

import pytest

from tests.spark_apps.conftest import PipelineFactory
from tests.spark_apps.harness import produce

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


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
    config = pipeline.config(
        transform={"sql": sql},
        trigger={"availableNow": True},
        source={
            "kafka": {
                "bootstrapServers": pipeline.broker.bootstrap_servers,
                "topics": [pipeline.source_topic],
                "maxOffsetsPerTrigger": 1500,
            }
        },
    )
    runner = pipeline.start(config)
    assert runner.wait(300) == 0, runner.tail()

    keys = sorted(k.decode() for k, _ in pipeline.output() if k is not None)
    assert keys == sorted(f"k{i}" for i in range(4000) if i % 4 != 3)
    assert pipeline.progress() == pipeline.end_offsets()
    assert any("commit mode partitioned" in m for m in runner.messages())
    assert {b["mode"] for b in runner.batches()} == {"partitioned"}
    assert sum(b["rows_in"] for b in runner.batches()) == 4000
    assert runner.stderr == ""
