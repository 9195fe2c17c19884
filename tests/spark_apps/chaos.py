"""Chaos scenarios: a pipeline's runner SIGKILLed again and again, then every output checked.

Each scenario produces uniquely keyed input, lets :func:`~tests.spark_apps.runs.
kill_repeatedly` kill the runner ``kills`` times (most kills while a batch reads, produces
or commits), runs a last runner to the end, and asserts what a ``read_committed`` reader
sees (every input's output exactly once) and that G equals the source end offsets.
``test_chaos.py`` runs them on one broker, ``test_cross_cluster.py`` with the sink on
another Kafka cluster.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from devenv.runners import Pipeline, Runner, produce
from tests.spark_apps.runs import BATCHES_PER_KILL, assert_exactly_once, finish, kill_repeatedly


def seeded() -> random.Random:
    """A random generator for a scenario's kills, its seed printed (pytest shows it on failure)."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    return random.Random(seed)


def _source(pipeline: Pipeline, per_batch: int) -> dict[str, Any]:
    return {
        "kafka": {
            "bootstrapServers": pipeline.broker.bootstrap_servers,
            "topics": [pipeline.source_topic],
            "maxOffsetsPerTrigger": per_batch,
        }
    }


def partitioned_filter(
    pipeline: Pipeline,
    rng: random.Random,
    *,
    records: int,
    kills: int,
    per_batch: int,
    generation: Callable[[int], int | None] = lambda _: None,
) -> list[Runner]:
    """A filter on 4 partitions (partition 3 has no output) under ``kills`` kills; its runners.

    ``generation(k)``: the checkpoint generation of the k-th runner (the last one is
    ``generation(kills)``); a new one starts from G alone, as after a lost checkpoint.
    """
    assert records // per_batch > kills * BATCHES_PER_KILL, "the input must outlast every kill"
    produce(
        pipeline.broker,
        pipeline.source_topic,
        ((f"k{i:06d}", f"v{i}", i % 4) for i in range(records)),
    )
    # Partition 3 never has output: its progress moves in offsets-only transactions.
    sql = (
        "SELECT key, concat('out-', CAST(value AS STRING)) AS value FROM source "
        "WHERE partition <> 3 AND NOT CAST(key AS STRING) LIKE '%7'"
    )
    config = pipeline.config(transform={"sql": sql}, source=_source(pipeline, per_batch))

    runners = kill_repeatedly(pipeline, config, kills, rng, generation=generation)
    runners.append(finish(pipeline, config, generation=generation(kills)))

    expected = (f"k{i:06d}" for i in range(records) if i % 4 != 3 and i % 10 != 7)
    assert_exactly_once(pipeline.output(), expected)
    assert pipeline.progress() == pipeline.end_offsets()
    # The killed runners may have done all the work: the last one then has no batch.
    assert {b["mode"] for r in runners for b in r.batches()} == {"partitioned"}
    return runners


def window_counts(
    pipeline: Pipeline, rng: random.Random, *, records: int, kills: int, per_batch: int
) -> None:
    """Per-minute counts of impressions (coordinated, append mode) under ``kills`` kills."""
    assert records // per_batch > kills * BATCHES_PER_KILL, "the input must outlast every kill"
    base = datetime(2026, 3, 1, tzinfo=UTC)
    expected: Counter[tuple[str, str]] = Counter()
    produced = []
    for i in range(records):
        when = base + timedelta(milliseconds=10 * i)
        campaign = f"c-{(i * 7919) % 17}"
        expected[(campaign, when.replace(second=0, microsecond=0).isoformat())] += 1
        event = {
            "impression_id": f"i{i}",
            "campaign_id": campaign,
            "event_time": when.isoformat().replace("+00:00", "Z"),
        }
        produced.append((f"i{i}", json.dumps(event), i % 4))
    # The last event, an hour later, moves the watermark past every window above.
    flush = {
        "impression_id": "flush",
        "campaign_id": "flush",
        "event_time": (base + timedelta(hours=2)).isoformat().replace("+00:00", "Z"),
    }
    produced.append(("flush", json.dumps(flush), 0))
    produce(pipeline.broker, pipeline.source_topic, produced)
    config = pipeline.config(
        source=_source(pipeline, per_batch),
        transform={
            "python": {"module": "eop_spark.examples.impressions", "function": "count_impressions"},
            "outputMode": "append",
        },
    )

    kill_repeatedly(pipeline, config, kills, rng)
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
        assert key not in got, f"window {key} emitted twice"
        got[key] = int(str(window["impressions"]))
    assert got == expected
    assert pipeline.progress() == pipeline.end_offsets()
