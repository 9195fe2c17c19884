"""Chaos scenarios: a pipeline's runner SIGKILLed again and again, then every output checked.

Each scenario produces uniquely keyed input as its runners consume it (:class:`~tests.
spark_apps.runs.Input`), lets :func:`~tests.spark_apps.runs.kill_repeatedly` kill the
runner ``kills`` times (most kills while a batch reads, produces or commits), runs a last
runner to the end, and asserts what a ``read_committed`` reader sees (every input's output
exactly once) and that G equals the source end offsets.
``test_chaos.py`` runs them on one broker, ``test_cross_cluster.py`` with the sink on
another Kafka cluster.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from devenv.runners import Pipeline, Runner
from tests.spark_apps.runs import Input, assert_exactly_once, finish, kill_repeatedly


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
    kills: int,
    per_batch: int,
    generation: Callable[[int], int | None] = lambda _: None,
) -> list[Runner]:
    """A filter on 4 partitions (partition 3 has no output) under ``kills`` kills; its runners.

    ``generation(k)``: the checkpoint generation of the k-th runner (the last one is
    ``generation(kills)``); a new one starts from G alone, as after a lost checkpoint.
    """
    records = ((f"k{i:06d}", f"v{i}", i % 4) for i in itertools.count())
    source = Input(pipeline, records, per_batch)
    # Partition 3 never has output: its progress moves in offsets-only transactions.
    sql = (
        "SELECT key, concat('out-', CAST(value AS STRING)) AS value FROM source "
        "WHERE partition <> 3 AND NOT CAST(key AS STRING) LIKE '%7'"
    )
    config = pipeline.config(transform={"sql": sql}, source=_source(pipeline, per_batch))

    runners = kill_repeatedly(pipeline, config, kills, rng, source, generation=generation)
    runners.append(finish(pipeline, config, generation=generation(kills)))

    expected = (key for key, _, partition in source.produced if partition != 3)
    assert_exactly_once(pipeline.output(), (key for key in expected if not key.endswith("7")))
    print(f"{len(source.produced)} records in, {kills} kills")
    assert pipeline.progress() == pipeline.end_offsets()
    # The killed runners may have done all the work: the last one then has no batch.
    assert {b["mode"] for r in runners for b in r.batches()} == {"partitioned"}
    return runners


_IMPRESSIONS_FROM = datetime(2026, 3, 1, tzinfo=UTC)


def _impression(key: str, campaign: str, when: datetime, partition: int) -> tuple[str, str, int]:
    event = {
        "impression_id": key,
        "campaign_id": campaign,
        "event_time": when.isoformat().replace("+00:00", "Z"),
    }
    return (key, json.dumps(event), partition)


def _impressions() -> Iterator[tuple[str, str, int]]:
    """Impressions 10 ms apart from :data:`_IMPRESSIONS_FROM`, on 17 campaigns."""
    for i in itertools.count():
        when = _IMPRESSIONS_FROM + timedelta(milliseconds=10 * i)
        yield _impression(f"i{i}", f"c-{(i * 7919) % 17}", when, i % 4)


def window_counts(pipeline: Pipeline, rng: random.Random, *, kills: int, per_batch: int) -> None:
    """Per-minute counts of impressions (coordinated, append mode) under ``kills`` kills."""
    source = Input(pipeline, _impressions(), per_batch)
    config = pipeline.config(
        source=_source(pipeline, per_batch),
        transform={
            "python": {"module": "eop_spark.examples.impressions", "function": "count_impressions"},
            "outputMode": "append",
        },
    )

    kill_repeatedly(pipeline, config, kills, rng, source)
    # The last event, two hours later, moves the watermark past every window before it.
    source.add([_impression("flush", "flush", _IMPRESSIONS_FROM + timedelta(hours=2), 0)])
    expected: Counter[tuple[str, str]] = Counter()
    for _, value, _ in source.produced[:-1]:
        event = json.loads(value)
        when = datetime.fromisoformat(event["event_time"]).replace(second=0, microsecond=0)
        expected[(event["campaign_id"], when.isoformat())] += 1
    print(f"{len(source.produced)} records in, {kills} kills")
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
