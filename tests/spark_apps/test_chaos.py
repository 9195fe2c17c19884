"""Invariant 1 under chaos: the runner is SIGKILLed at random moments, again and again.

200,000 uniquely keyed records on 4 partitions; the runner process group (driver,
JVM, Python workers) is killed 8 times, including while transactions are open
or committing, and restarted each time.  A read_committed reader must then see
every input's output exactly once, and G must equal the source end offsets.

Each test runs with the checkpoint on a volume (the work directory) and in object
storage (``s3a://`` on the SeaweedFS test server, where a kill may also land in
the middle of an upload of an offsets, commits or state file; the coordinated
one with half the kills there).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from tests.spark_apps.conftest import PipelineFactory
from tests.spark_apps.harness import (
    BATCHES_PER_KILL,
    ObjectStoreCheckpoints,
    Pipeline,
    assert_exactly_once,
    finish,
    kill_repeatedly,
    produce,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

RECORDS = 200_000
KILLS = 8
#: Offsets per batch: the input must outlast every kill (see kill_repeatedly).
PER_BATCH = 5_000
assert RECORDS // PER_BATCH > KILLS * BATCHES_PER_KILL


@pytest.fixture(params=["volume", pytest.param("s3a", marks=pytest.mark.s3)])
def checkpoints(request: pytest.FixtureRequest) -> ObjectStoreCheckpoints | None:
    """Where the chaos tests keep checkpoints: a directory (None), or a bucket."""
    if request.param == "volume":
        return None
    store: ObjectStoreCheckpoints = request.getfixturevalue("s3_checkpoints")
    return store


def test_partitioned_filter_survives_kill_9(
    make_pipeline: PipelineFactory, checkpoints: ObjectStoreCheckpoints | None
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    pipeline = make_pipeline(object_store=checkpoints)
    produce(
        pipeline.broker,
        pipeline.source_topic,
        ((f"k{i:06d}", f"v{i}", i % 4) for i in range(RECORDS)),
    )
    # Partition 3 never has output: its progress moves in offsets-only transactions.
    sql = (
        "SELECT key, concat('out-', CAST(value AS STRING)) AS value FROM source "
        "WHERE partition <> 3 AND NOT CAST(key AS STRING) LIKE '%7'"
    )
    source = {
        "kafka": {
            "bootstrapServers": pipeline.broker.bootstrap_servers,
            "topics": [pipeline.source_topic],
            "maxOffsetsPerTrigger": PER_BATCH,
        }
    }
    config = pipeline.config(transform={"sql": sql}, source=source)

    runners = kill_repeatedly(pipeline, config, KILLS, rng)
    runners.append(finish(pipeline, config))

    expected = (f"k{i:06d}" for i in range(RECORDS) if i % 4 != 3 and i % 10 != 7)
    assert_exactly_once(pipeline.output(), expected)
    assert pipeline.progress() == pipeline.end_offsets(), f"seed {seed}"
    _assert_checkpointed_in(checkpoints, pipeline)
    # The killed runners may have done all the work: the last one then has no batch.
    assert {b["mode"] for r in runners for b in r.batches()} == {"partitioned"}


def test_coordinated_window_counts_survive_kill_9(
    make_pipeline: PipelineFactory, checkpoints: ObjectStoreCheckpoints | None
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    pipeline = make_pipeline(object_store=checkpoints)
    base = datetime(2026, 3, 1, tzinfo=UTC)
    expected: Counter[tuple[str, str]] = Counter()
    records = []
    for i in range(RECORDS):
        when = base + timedelta(milliseconds=10 * i)
        campaign = f"c-{(i * 7919) % 17}"
        expected[(campaign, when.replace(second=0, microsecond=0).isoformat())] += 1
        event = {
            "impression_id": f"i{i}",
            "campaign_id": campaign,
            "event_time": when.isoformat().replace("+00:00", "Z"),
        }
        records.append((f"i{i}", json.dumps(event), i % 4))
    # The last event, an hour later, moves the watermark past every window above.
    flush = {
        "impression_id": "flush",
        "campaign_id": "flush",
        "event_time": (base + timedelta(hours=2)).isoformat().replace("+00:00", "Z"),
    }
    records.append(("flush", json.dumps(flush), 0))
    produce(pipeline.broker, pipeline.source_topic, records)
    source = {
        "kafka": {
            "bootstrapServers": pipeline.broker.bootstrap_servers,
            "topics": [pipeline.source_topic],
            "maxOffsetsPerTrigger": PER_BATCH,
        }
    }
    config = pipeline.config(
        source=source,
        transform={
            "python": {"module": "eop_spark.examples.impressions", "function": "count_impressions"},
            "outputMode": "append",
        },
    )

    # In a bucket, half the kills: the partitioned test takes the full count there, and a
    # stateful query's restarts read and write its state in the store (~11 min with 8 kills
    # on 2 busy cores).
    kill_repeatedly(pipeline, config, KILLS if checkpoints is None else KILLS // 2, rng)
    runner = pipeline.start(config)

    def windows() -> list[dict[str, object]]:
        return [json.loads(v) for _, v in pipeline.output() if v is not None]

    runner.wait_for(
        "every window counted",
        lambda: pipeline.caught_up() and len(windows()) >= len(expected),
        600,
    )
    runner.terminate()
    assert runner.wait(180) == 0, runner.tail()

    got: Counter[tuple[str, str]] = Counter()
    for window in windows():
        start = datetime.fromisoformat(str(window["window_start"])).astimezone(UTC)
        key = (str(window["campaign_id"]), start.isoformat())
        assert key not in got, f"window {key} emitted twice (seed {seed})"
        got[key] = int(str(window["impressions"]))
    assert got == expected, f"seed {seed}"
    assert pipeline.progress() == pipeline.end_offsets()
    _assert_checkpointed_in(checkpoints, pipeline)


def _assert_checkpointed_in(checkpoints: ObjectStoreCheckpoints | None, pipeline: Pipeline) -> None:
    """The batches (and a stateful query's state) were checkpointed in the bucket."""
    if checkpoints is None:
        return
    keys = checkpoints.keys(pipeline.name)
    assert any(k.startswith("gen-0/commits/") for k in keys), keys[:20]
    assert not [k for k in keys if ".tmp" in k], "a temporary file was left in the bucket"
