"""A real incompatible upgrade: the runner names it in the termination message.

The operator falls back to a new checkpoint generation when a ``last-state``
restart fails with ``[IncompatibleCheckpoint]`` (docs/lifecycle.md); this
proves Spark's own error is recognised, on a real broker with real Spark.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devenv.runners import produce
from tests.spark_apps.conftest import PipelineFactory

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.mark.slow
def test_a_different_aggregation_on_the_same_checkpoint_is_incompatible(
    make_pipeline: PipelineFactory, tmp_path: Path
) -> None:
    pipeline = make_pipeline(source_partitions=1, sink_partitions=1)
    produce(pipeline.broker, pipeline.source_topic, ((f"k{i % 3}", "v", 0) for i in range(30)))
    counting = {
        "sql": "SELECT key, CAST(count(*) AS STRING) AS value FROM source GROUP BY key",
        "outputMode": "update",
    }
    first = pipeline.start(pipeline.config(transform=counting, trigger={"availableNow": True}))
    assert first.wait(300) == 0, first.tail()

    produce(pipeline.broker, pipeline.source_topic, ((f"k{i}", "w", 0) for i in range(5)))
    summing = {
        "sql": "SELECT key, max(value) AS value, count(*) AS n FROM source GROUP BY key",
        "outputMode": "update",
    }
    termination_log = tmp_path / "termination-log"
    second = pipeline.start(
        pipeline.config(transform=summing, trigger={"availableNow": True}),
        env={"EOP_TERMINATION_LOG": str(termination_log)},
    )
    assert second.wait(300) != 0, second.tail()
    line = termination_log.read_text().strip()
    assert line.startswith("eop: error: [IncompatibleCheckpoint] "), line
