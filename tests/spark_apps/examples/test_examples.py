"""The example pipelines: their manifests are valid, and together they count impressions exactly.

The end-to-end test chains both examples on the real broker: raw impressions ->
``impressions-clean.yaml`` (SQL, partitioned) -> ``impressions-count.yaml``
(Python, coordinated, windowed) and compares with a recount of the input.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.runners import TEST_SPARK, Pipeline, produce
from eop_spark.contract.spec import SinkSpec, SourceSpec, SparkSpec, TransformSpec, TriggerSpec
from eop_spark.examples.impressions import CLEAN_IMPRESSIONS_SQL
from tests.spark_apps.conftest import PipelineFactory

EXAMPLES = Path(__file__).resolve().parents[3] / "spark_apps" / "eop_spark" / "examples"
BASE_TIME = datetime(2026, 1, 1, tzinfo=UTC)


def _manifest(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return data


@pytest.mark.parametrize("name", ["impressions-clean.yaml", "impressions-count.yaml"])
def test_example_manifest_is_a_valid_pipeline(name: str) -> None:
    manifest = _manifest(name)
    assert manifest["apiVersion"] == "exactlyonce.io/v1alpha1"
    assert manifest["kind"] == "ExactlyOncePipeline"
    assert manifest["metadata"]["name"] == name.removesuffix(".yaml")
    spec = manifest["spec"]
    SourceSpec.model_validate(spec["source"])
    TransformSpec.model_validate(spec["transform"])
    SinkSpec.model_validate(spec["sink"])
    TriggerSpec.model_validate(spec["trigger"])
    SparkSpec.model_validate(spec["spark"])


def test_clean_manifest_runs_the_module_sql() -> None:
    sql = _manifest("impressions-clean.yaml")["spec"]["transform"]["sql"]
    assert sql.split() == CLEAN_IMPRESSIONS_SQL.split()


Records = list[tuple[str, str, int]]


def _raw_events(count: int, seed: int) -> tuple[Records, Counter[tuple[str, str]]]:
    """Raw impressions (some invalid or from bots) and the exact count per campaign minute."""
    rng = random.Random(seed)
    records: Records = []
    expected: Counter[tuple[str, str]] = Counter()
    for i in range(count):
        when = BASE_TIME + timedelta(milliseconds=100 * i)
        event: dict[str, Any] = {
            "impression_id": f"imp-{i}",
            "campaign_id": f"c-{rng.randrange(12)}",
            "event_time": when.isoformat().replace("+00:00", "Z"),
            "placement": rng.choice(["top", "side", "feed"]),
            "user_agent": "Mozilla/5.0",
            "is_bot": False,
        }
        kind = rng.random()
        if kind < 0.05:
            del event["impression_id"]
        elif kind < 0.08:
            event["event_time"] = "not a time"
        elif kind < 0.12:
            event["is_bot"] = True
        elif kind < 0.15:
            event["user_agent"] = "Googlebot/2.1"
        else:
            minute = when.replace(second=0, microsecond=0)
            expected[(event["campaign_id"], minute.isoformat())] += 1
        records.append((f"raw-{i}", json.dumps(event), i % 4))
    return records, expected


def _from_manifest(pipeline: Pipeline, name: str, **overrides: Any) -> dict[str, Any]:
    spec = _manifest(name)["spec"]
    bootstrap = pipeline.broker.bootstrap_servers
    source = spec["source"]["kafka"] | {
        "bootstrapServers": bootstrap,
        "topics": [pipeline.source_topic],
    }
    sink = spec["sink"]["kafka"] | {"bootstrapServers": bootstrap, "topic": pipeline.sink_topic}
    return pipeline.config(
        source={"kafka": source},
        transform=spec["transform"],
        sink={"kafka": sink},
        spark=TEST_SPARK,
        **overrides,
    )


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_examples_clean_then_count_impressions_exactly(make_pipeline: PipelineFactory) -> None:
    records, expected = _raw_events(6000, seed=7)
    # A last impression an hour later moves the watermark past every real window.
    flush_time = (BASE_TIME + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    records.append(
        (
            "flush",
            json.dumps(
                {"impression_id": "flush", "campaign_id": "flush", "event_time": flush_time}
            ),
            0,
        )
    )
    clean = make_pipeline()
    produce(clean.broker, clean.source_topic, records)

    cleaner = clean.start(
        _from_manifest(clean, "impressions-clean.yaml", trigger={"availableNow": True})
    )
    assert cleaner.wait(300) == 0, cleaner.tail()
    assert {b["mode"] for b in cleaner.batches()} == {"partitioned"}
    clean_keys = Counter(k.decode() for k, _ in clean.output() if k is not None)
    assert max(clean_keys.values()) == 1
    assert len(clean_keys) == sum(expected.values()) + 1  # + the flush impression

    count = make_pipeline()
    count.source_topic = clean.sink_topic
    counter = count.start(
        _from_manifest(count, "impressions-count.yaml", trigger={"processingTime": "1s"})
    )

    def windows() -> list[dict[str, Any]]:
        return [json.loads(v) for _, v in count.output() if v is not None]

    counter.wait_for("every window counted", lambda: len(windows()) >= len(expected), 300)
    counter.terminate()
    assert counter.wait(120) == 0, counter.tail()
    assert {b["mode"] for b in counter.batches()} == {"coordinated"}

    got: Counter[tuple[str, str]] = Counter()
    for window in windows():
        start = datetime.fromisoformat(window["window_start"]).astimezone(UTC)
        key = (window["campaign_id"], start.isoformat())
        assert key not in got, f"window {key} emitted twice"
        got[key] = window["impressions"]
    assert got == expected
