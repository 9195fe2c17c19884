"""A new checkpoint generation never guesses (invariants 7 and 8), with real Spark and Kafka.

* Progress missing: an earlier generation committed a partition, the progress
  group no longer has it (deleted here; expired in production): the new
  generation stops with one line naming the partition, and publishes nothing;
  also when the checkpoint root is lost, from the partitions the operator saw
  the group hold (``committedPartitions``).
* Stateful query: a windowed count whose new generation would resume the
  progress group with empty state stops with the choices; with
  ``transform.allowEmptyState`` it runs.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import pytest

from devenv.runners import Pipeline, Runner, produce
from eop_spark.contract.errors import EXIT_PROGRESS_MISSING, EXIT_STATE_LOST
from tests.spark_apps.runs import assert_exactly_once

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 60


def _delete_progress(pipeline: Pipeline, partition: int) -> None:
    """Delete G's committed offset of one source partition, as an expiry would."""
    pipeline.delete_progress(partition)
    assert (pipeline.source_topic, partition) not in pipeline.progress()


def _run_to_end(pipeline: Pipeline, config: dict[str, Any], generation: int = 0) -> Runner:
    """Run one generation with ``trigger.availableNow`` until the runner exits."""
    runner = pipeline.start(config, generation=generation)
    runner.wait(240)
    return runner


def _failure_lines(runner: Runner) -> list[str]:
    return [line for line in runner.stderr.splitlines() if line.startswith("eop: error:")]


@pytest.mark.slow
def test_missing_progress_stops_a_new_generation(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline(source_partitions=2, sink_partitions=1)
    produce(pipeline.broker, pipeline.source_topic, [(f"k{i}", "v", i % 2) for i in range(RECORDS)])
    config = pipeline.config(trigger={"availableNow": True})
    first = _run_to_end(pipeline, config)
    assert first.proc.returncode == 0, first.tail()
    assert pipeline.caught_up()

    _delete_progress(pipeline, 1)
    refused = _run_to_end(pipeline, config, generation=1)
    assert refused.proc.returncode == EXIT_PROGRESS_MISSING, refused.tail()
    lines = _failure_lines(refused)
    assert len(lines) == 1
    assert f"{pipeline.source_topic}-1" in lines[0]
    assert f"{pipeline.source_topic}-0" not in lines[0]
    assert "allowMissingProgress" in lines[0]
    assert_exactly_once(pipeline.output(), [f"k{i}" for i in range(RECORDS)])

    # The checkpoint root is lost too: the partitions the operator saw G hold still refuse, in
    # the new generation the operator starts for a lost checkpoint.
    shutil.rmtree(config["checkpointRoot"])
    seen = config | {
        "committedPartitions": {pipeline.source_topic: [0, 1]},
        "generationReason": "CheckpointLost",
    }
    refused = _run_to_end(pipeline, seen, generation=2)
    assert refused.proc.returncode == EXIT_PROGRESS_MISSING, refused.tail()
    (line,) = _failure_lines(refused)
    assert f"{pipeline.source_topic}-1, which the operator saw it hold before" in line
    assert f"{pipeline.source_topic}-0" not in line
    assert_exactly_once(pipeline.output(), [f"k{i}" for i in range(RECORDS)])


WINDOWED_COUNT = (
    "SELECT CAST(window.start AS STRING) AS key, CAST(count(*) AS STRING) AS value "
    "FROM source GROUP BY window(timestamp, '1 hour')"
)


@pytest.mark.slow
def test_stateful_new_generation_stops_unless_empty_state_is_allowed(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline(source_partitions=1, sink_partitions=1)
    produce(pipeline.broker, pipeline.source_topic, [(f"k{i}", "v", 0) for i in range(RECORDS)])
    transform = {"sql": WINDOWED_COUNT, "outputMode": "update"}
    config = pipeline.config(trigger={"availableNow": True}, transform=transform)
    first = _run_to_end(pipeline, config)
    assert first.proc.returncode == 0, first.tail()
    published = pipeline.output()
    assert published, "the windowed count published nothing"

    produce(pipeline.broker, pipeline.source_topic, [(f"m{i}", "v", 0) for i in range(10)])
    refused = _run_to_end(pipeline, config, generation=1)
    assert refused.proc.returncode == EXIT_STATE_LOST, refused.tail()
    lines = _failure_lines(refused)
    assert len(lines) == 1
    assert "stateless" in lines[0] and "allowEmptyState" in lines[0], lines[0]
    assert pipeline.output() == published  # nothing published by the refused generation

    allowed = config | {"transform": transform | {"allowEmptyState": True}}
    opted_in = _run_to_end(pipeline, allowed, generation=2)
    assert opted_in.proc.returncode == 0, opted_in.tail()
    assert pipeline.caught_up()
    assert len(pipeline.output()) > len(published)
