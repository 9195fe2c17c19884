"""Checkpoints in object storage (``s3a://`` on a real SeaweedFS), with real Spark and Kafka.

* A deleted prefix is a lost checkpoint: a runner that G's record says should find
  a checkpoint stops with ``[CheckpointLost]`` and publishes nothing; the new
  generation the operator then starts resumes from G, exactly once.
* Generations live side by side under the root: an incompatible upgrade is named,
  the fallback generation starts from G next to the old one, and a later
  generation reads the earlier ones' offsets logs from the store (its guard).
* ``eop checkpoint delete`` (the retention Delete Job's command) deletes one
  pipeline's root and nothing else.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devenv.runners import REPO, ObjectStoreCheckpoints, Pipeline, Runner, produce, runner_env
from devenv.s3 import S3Server
from eop_spark.contract.errors import EXIT_PROGRESS_MISSING, EXIT_RUNTIME
from tests.spark_apps.conftest import PipelineFactory
from tests.spark_apps.runs import assert_exactly_once

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.s3]


def _run_to_end(pipeline: Pipeline, config: dict[str, object], generation: int = 0) -> Runner:
    runner = pipeline.start(config, generation=generation)
    runner.wait(300)
    return runner


def _failure_line(runner: Runner) -> str:
    (line,) = [line for line in runner.stderr.splitlines() if line.startswith("eop: error:")]
    return line


def _generations(store: ObjectStoreCheckpoints, pipeline: Pipeline) -> set[str]:
    return {key.split("/", 1)[0] for key in store.keys(pipeline.name)}


@pytest.mark.slow
def test_a_deleted_prefix_is_a_lost_checkpoint_and_the_next_generation_resumes_from_g(
    make_pipeline: PipelineFactory, s3_checkpoints: ObjectStoreCheckpoints
) -> None:
    pipeline = make_pipeline(source_partitions=2, sink_partitions=2, object_store=s3_checkpoints)
    first_keys = [f"a{i:04d}" for i in range(400)]
    produce(
        pipeline.broker, pipeline.source_topic, ((k, k, i % 2) for i, k in enumerate(first_keys))
    )
    config = pipeline.config(trigger={"availableNow": True})
    first = _run_to_end(pipeline, config)
    assert first.proc.returncode == 0, first.tail()
    assert _generations(s3_checkpoints, pipeline) == {"gen-0"}

    later_keys = [f"b{i:04d}" for i in range(300)]
    produce(
        pipeline.broker, pipeline.source_topic, ((k, k, i % 2) for i, k in enumerate(later_keys))
    )
    assert s3_checkpoints.delete(pipeline.name) > 0
    published = pipeline.output()

    # What the operator renders once it has seen G hold progress (status.progress.heldPartitions).
    held = config | {"committedPartitions": {pipeline.source_topic: [0, 1]}}
    lost = _run_to_end(pipeline, held)
    assert lost.proc.returncode == EXIT_RUNTIME, lost.tail()
    line = _failure_line(lost)
    assert line.startswith("eop: error: [CheckpointLost] "), line
    assert s3_checkpoints.root(pipeline.name) in line and "--generation 1" in line
    assert pipeline.output() == published  # stopped before it read or wrote anything

    # The generation the operator starts for it: from G, exactly once.
    resumed = _run_to_end(pipeline, held | {"generationReason": "CheckpointLost"}, generation=1)
    assert resumed.proc.returncode == 0, resumed.tail()
    assert any("2 of 2 partitions resume from progress group" in m for m in resumed.messages())
    assert_exactly_once(pipeline.output(), first_keys + later_keys)
    assert pipeline.progress() == pipeline.end_offsets()
    assert _generations(s3_checkpoints, pipeline) == {"gen-1"}


COUNTING = {
    "sql": "SELECT key, CAST(count(*) AS STRING) AS value FROM source GROUP BY key",
    "outputMode": "update",
}
SUMMING = {
    "sql": "SELECT key, max(value) AS value, count(*) AS n FROM source GROUP BY key",
    "outputMode": "update",
}


@pytest.mark.slow
def test_generations_live_side_by_side_in_the_bucket(
    make_pipeline: PipelineFactory, s3_checkpoints: ObjectStoreCheckpoints
) -> None:
    pipeline = make_pipeline(source_partitions=2, sink_partitions=1, object_store=s3_checkpoints)
    produce(pipeline.broker, pipeline.source_topic, ((f"k{i % 3}", "v", i % 2) for i in range(30)))
    first = _run_to_end(
        pipeline, pipeline.config(transform=COUNTING, trigger={"availableNow": True})
    )
    assert first.proc.returncode == 0, first.tail()
    assert any(key.startswith("gen-0/state/") for key in s3_checkpoints.keys(pipeline.name))

    # An incompatible upgrade on the same generation: Spark reads the state in the bucket and
    # refuses; the runner names it, so the operator can fall back.
    produce(pipeline.broker, pipeline.source_topic, ((f"k{i}", "w", i % 2) for i in range(6)))
    upgraded = pipeline.config(transform=SUMMING, trigger={"availableNow": True})
    refused = _run_to_end(pipeline, upgraded)
    assert refused.proc.returncode != 0, refused.tail()
    assert _failure_line(refused).startswith("eop: error: [IncompatibleCheckpoint] ")

    # The fallback: a new generation from G beside the old one (which stays as it was).
    fallback = upgraded | {
        "generationReason": "FellBack",
        "transform": SUMMING | {"allowEmptyState": True},
    }
    fell_back = _run_to_end(pipeline, fallback, generation=1)
    assert fell_back.proc.returncode == 0, fell_back.tail()
    assert pipeline.progress() == pipeline.end_offsets()
    assert _generations(s3_checkpoints, pipeline) == {"gen-0", "gen-1"}

    # A later generation reads the earlier ones' offsets logs from the bucket: G losing a
    # partition they committed stops it, naming the generation.
    pipeline.delete_progress(1)
    guarded = _run_to_end(pipeline, fallback | {"generationReason": "SpecChanged"}, generation=2)
    assert guarded.proc.returncode == EXIT_PROGRESS_MISSING, guarded.tail()
    line = _failure_line(guarded)
    assert f"{pipeline.source_topic}-1" in line and "gen-1 committed before" in line, line


def test_checkpoint_delete_removes_one_pipelines_root_and_nothing_else(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    for key in ("ns/a/gen-0/offsets/0", "ns/a/gen-0/commits/0", "ns/a/gen-1/metadata"):
        s3_server.put_object(s3_bucket, key, b"v1\n{}")
    s3_server.put_object(s3_bucket, "ns/ab/gen-0/metadata", b"{}")  # a neighbour's prefix

    def delete() -> subprocess.CompletedProcess[str]:
        options = [f"--option={k}={v}" for k, v in s3_server.hadoop_options().items()]
        command = ["checkpoint", "delete", f"s3a://{s3_bucket}/ns/a", *options]
        return subprocess.run(
            [sys.executable, "-m", "eop_operator.cli", *command],
            env=runner_env(s3_server.credentials_env() | {"EOP_SCRATCH_DIR": str(tmp_path)}),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )

    done = delete()
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"deleted 3 files under s3a://{s3_bucket}/ns/a" in done.stdout
    assert s3_server.list_keys(s3_bucket) == ["ns/ab/gen-0/metadata"]
    again = delete()  # the Job may run twice: nothing there is not an error
    assert again.returncode == 0 and "nothing under" in again.stdout, again.stderr
