"""A stuck runner can be asked where it waits: SIGUSR1 prints every thread's stack."""

from __future__ import annotations

import pytest

from devenv.runners import produce
from tests.spark_apps.conftest import PipelineFactory

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_sigusr1_prints_the_threads_and_the_run_goes_on(make_pipeline: PipelineFactory) -> None:
    pipeline = make_pipeline()
    produce(pipeline.broker, pipeline.source_topic, ((f"k{i}", f"v{i}", i % 4) for i in range(100)))
    runner = pipeline.start(pipeline.config())
    runner.wait_batches(1)

    stacks = runner.stacks()

    # The runner's main thread supervises the query; Spark's Python workers wait for tasks.
    assert "in supervise" in stacks and "eop_spark/runtime/runner.py" in stacks, stacks
    assert "pyspark/daemon.py" in stacks or "pyspark/worker.py" in stacks, stacks
    # The signal only prints: the run goes on and new input is still committed.
    produce(pipeline.broker, pipeline.source_topic, [("late", "v", 0)])
    runner.wait_for("the late record", lambda: b"late" in {k for k, _ in pipeline.output()}, 120)
    runner.terminate()
    assert runner.wait(120) == 0, runner.tail()
