"""Chaos: the runner is SIGKILLed at random moments, over and over.

Uniquely keyed records on 4 partitions, 5,000 per batch, produced as the runners
consume them; the runner process group (driver, JVM, Python workers) is killed 8 times,
including while transactions are open or committing, and restarted each time. A
read_committed reader must then see every input's output exactly once, and G must equal
the source end offsets (the scenarios are in ``tests/spark_apps/chaos.py``).

Each test runs with the checkpoint on a volume (the work directory) and in object
storage (``s3a://`` on the SeaweedFS test server, where a kill may also land in
the middle of an upload of an offsets, commits or state file; the coordinated
one with half the kills there). Each runs on the session's Kafka 4.x broker with the
volume, and with the bucket on a broker of the older Kafka release users run
(``field_broker``, Kafka 3.x, transaction protocol v1 only: docs/exactly-once.md,
"Kafka versions"): the partitioned driver commits offsets-only transactions with
librdkafka and its tasks with the JVM's Kafka client, the coordinated driver commits
the records and G in one librdkafka transaction, so every client stack meets each
release. The two claims of a bucket run (the checkpoint in a bucket, the older release)
are independent (the checkpoint never touches Kafka), so one run with all 8 kills serves
both.
"""

from __future__ import annotations

import pytest

from devenv.runners import ObjectStoreCheckpoints, Pipeline
from tests.plugins.kafka import FIELD_KAFKA_VERSION, KAFKA_VERSION, assert_runs_release
from tests.spark_apps import chaos
from tests.spark_apps.conftest import PipelineFactory

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

KILLS = 8
#: Offsets per batch.
PER_BATCH = 5_000


VOLUME = pytest.param("volume")
#: The bucket, the pipeline on the ``field_broker`` (Kafka 3.x).
S3A_ON_FIELD_BROKER = pytest.param(
    "s3a",
    marks=[pytest.mark.s3, pytest.mark.field_broker],
    id=f"s3a-kafka-{FIELD_KAFKA_VERSION}",
)


@pytest.fixture
def checkpoints(request: pytest.FixtureRequest) -> ObjectStoreCheckpoints | None:
    """Where the chaos tests keep checkpoints (the test's parameter): a directory (None), or
    a bucket."""
    if request.param == "volume":
        return None
    store: ObjectStoreCheckpoints = request.getfixturevalue("s3_checkpoints")
    return store


@pytest.mark.parametrize("checkpoints", [VOLUME, S3A_ON_FIELD_BROKER], indirect=True)
def test_partitioned_filter_survives_kill_9(
    make_pipeline: PipelineFactory,
    checkpoints: ObjectStoreCheckpoints | None,
    request: pytest.FixtureRequest,
) -> None:
    pipeline = make_pipeline(object_store=checkpoints)
    _assert_on_the_release(pipeline, request)
    chaos.partitioned_filter(pipeline, chaos.seeded(), kills=KILLS, per_batch=PER_BATCH)
    _assert_checkpointed_in(checkpoints, pipeline)


@pytest.mark.parametrize("checkpoints", [VOLUME, S3A_ON_FIELD_BROKER], indirect=True)
def test_coordinated_window_counts_survive_kill_9(
    make_pipeline: PipelineFactory,
    checkpoints: ObjectStoreCheckpoints | None,
    request: pytest.FixtureRequest,
) -> None:
    pipeline = make_pipeline(object_store=checkpoints)
    _assert_on_the_release(pipeline, request)
    # In a bucket, half the kills: the partitioned test takes the full count there, and a
    # stateful query's restarts read and write its state in the store (~11 min with 8 kills
    # on 2 busy cores).
    kills = KILLS if checkpoints is None else KILLS // 2
    chaos.window_counts(pipeline, chaos.seeded(), kills=kills, per_batch=PER_BATCH)
    _assert_checkpointed_in(checkpoints, pipeline)


def _assert_checkpointed_in(checkpoints: ObjectStoreCheckpoints | None, pipeline: Pipeline) -> None:
    """The batches (and a stateful query's state) were checkpointed in the bucket."""
    if checkpoints is None:
        return
    keys = checkpoints.keys(pipeline.name)
    assert any(k.startswith("gen-0/commits/") for k in keys), keys[:20]
    assert not [k for k in keys if ".tmp" in k], "a temporary file was left in the bucket"


def _assert_on_the_release(pipeline: Pipeline, request: pytest.FixtureRequest) -> None:
    """The pipeline's broker, asked over the admin API, runs the Kafka release the test is for:
    :data:`FIELD_KAFKA_VERSION` when marked ``field_broker``, else 4.x (which reports no
    inter-broker protocol)."""
    field = _on_field_broker(request)
    assert_runs_release(pipeline.broker, FIELD_KAFKA_VERSION if field else KAFKA_VERSION)


def _on_field_broker(request: pytest.FixtureRequest) -> bool:
    """Whether the test's pipelines run on the ``field_broker`` (the parameter's marker)."""
    return request.node.get_closest_marker("field_broker") is not None
