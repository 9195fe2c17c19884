"""A Python task whose input fails upstream mid-partition: G covers only what it wrote.

In a Spark Python worker an upstream failure (a poison record, a source fetch
timeout) after some Arrow batches were sent reads as a clean end of input.
The task must not take that end for the end of its range: G moves only over
the rows the task saw, so the batch's retry writes the rest, and the driver
moves G over the records the query filtered out at the end of the range.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devenv.runners import produce
from tests.spark_apps.conftest import PipelineFactory
from tests.spark_apps.flaky_transform import FAIL_ONCE_ENV

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 3000
FAIL_AT = 2000
#: Keys this long make Spark send the rows before the failure to the worker (it buffers
#: small Arrow batches: with short records the worker sees none of them before it).
PAD = "x" * 1000


def test_a_python_task_failing_mid_partition_loses_no_record(
    make_pipeline: PipelineFactory, tmp_path: Path
) -> None:
    pipeline = make_pipeline(source_partitions=1, sink_partitions=1)
    produce(
        pipeline.broker,
        pipeline.source_topic,
        ((f"{i}:{PAD}", "skip" if i == RECORDS - 1 else str(i), 0) for i in range(RECORDS)),
    )
    marker = tmp_path / "failed"
    Path(f"{marker}.offset").write_text(str(FAIL_AT))
    spark = pipeline.config()["spark"]
    config = pipeline.config(
        transform={
            "python": {"module": "tests.spark_apps.flaky_transform", "function": "fail_once"}
        },
        trigger={"availableNow": True},
        spark=spark
        | {"conf": spark["conf"] | {"spark.sql.execution.arrow.maxRecordsPerBatch": "100"}},
    )
    runner = pipeline.start(config, env={"EOP_NO_JVM_WRITER": "1", FAIL_ONCE_ENV: str(marker)})
    assert runner.wait(120) == 0, runner.tail()
    assert marker.exists()  # the failure did happen, and the batch was retried
    assert any("injected upstream failure" in m for m in runner.messages())

    output = pipeline.output()
    values = {int(k.split(b":")[0]): v for k, v in output if k is not None}
    kept = range(RECORDS - 1)  # the last record is filtered out
    missing = sorted(set(kept) - values.keys())
    assert missing == [], f"{len(missing)} records lost, from offset {missing[:1]}"
    assert len(output) == len(kept)  # no duplicates either
    assert all(values[i] == str(i).encode() for i in kept)
    assert pipeline.progress() == pipeline.end_offsets()
