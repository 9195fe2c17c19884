"""``eop verify`` on real Kafka and Spark: a clean pipeline verifies clean, and each fault
injected into its sink afterwards is reported with the right count and key.

Each pipeline runs once; the faults pile up in its sink topic, each verified in the
module's Spark session (``eop verify`` in-process, as a user runs it: exit code and
printed report).
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from devenv.runners import Pipeline, client_config, produce, read_committed_messages
from eop_operator.cli import main as eop
from eop_spark.examples.impressions import BASE_TIME
from tests.spark_apps.conftest import PipelineFactory

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

#: Record-wise: a filter and a projection, so the output is not the input.
TRANSFORM = "SELECT key, upper(value) AS value FROM source WHERE value NOT LIKE '%7'"
RECORDS = 400
COUNTS = ("records in", "expected out", "found in sink", "duplicates", "missing", "unexpected")


def verify(capsys: pytest.CaptureFixture[str], config: Path, *options: str) -> tuple[int, str]:
    """``eop verify --config CONFIG [OPTIONS]``: its exit code and its report."""
    capsys.readouterr()
    code = eop(["verify", "--config", str(config), *options])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def counts(report: str) -> dict[str, int]:
    """The report's totals by name."""
    found = {}
    for name in COUNTS:
        match = re.search(rf"^  {name} +([\d,]+)$", report, re.MULTILINE)
        assert match, f"no {name!r} in the report:\n{report}"
        found[name] = int(match.group(1).replace(",", ""))
    return found


def section(report: str, kind: str) -> str:
    """The examples of one kind of discrepancy."""
    match = re.search(rf"^{kind}, \d+ of [\d,]+:\n((?:  .*\n?)+)", report, re.MULTILINE)
    return match.group(1) if match else ""


def batched_source(pipeline: Pipeline, records: int) -> dict[str, Any]:
    """The pipeline's source, read ``records`` records a micro-batch."""
    kafka = {
        "bootstrapServers": pipeline.broker.bootstrap_servers,
        "topics": [pipeline.source_topic],
        "maxOffsetsPerTrigger": records,
    }
    return {"kafka": kafka}


def delete_before(pipeline: Pipeline, partition: int, offset: int) -> None:
    """Delete the records of a sink partition before ``offset`` (as retention would)."""
    admin = AdminClient(client_config(pipeline.broker))
    deleted = admin.delete_records([TopicPartition(pipeline.sink_topic, partition, offset)])
    for future in deleted.values():
        future.result(30)


@pytest.mark.slow
def test_verify_finds_each_fault_injected_into_a_clean_pipelines_sink(
    make_pipeline: PipelineFactory, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = make_pipeline(source_partitions=2, sink_partitions=2)
    values = [f"v{i}" for i in range(RECORDS)]
    produce(
        pipeline.broker,
        pipeline.source_topic,
        ((f"k{i:03d}", v, i % 2) for i, v in enumerate(values)),
    )
    kept = sum(not v.endswith("7") for v in values)
    run_config = pipeline.config(transform={"sql": TRANSFORM}, trigger={"availableNow": True})
    runner = pipeline.start(run_config)
    assert runner.wait(300) == 0, runner.tail()
    config = pipeline.write_config(run_config, "verify.json")

    code, report = verify(capsys, config)
    assert code == 0, report
    assert counts(report) == dict.fromkeys(COUNTS, 0) | {
        "records in": RECORDS,
        "expected out": kept,
        "found in sink": kept,
    }
    assert f"(from the earliest offsets to progress group {pipeline.group})" in report

    # A record written twice, outside the pipeline's transactions.
    output = read_committed_messages(pipeline.broker, pipeline.sink_topic)
    twice = [m for m in output if m.partition() == 1][5]  # partition 0 loses records below
    produce(
        pipeline.broker,
        pipeline.sink_topic,
        [(twice.key().decode(), twice.value().decode(), twice.partition())],
    )
    code, report = verify(capsys, config)
    assert code == 7, report
    assert counts(report)["duplicates"] == 1, report
    assert counts(report)["found in sink"] == kept + 1
    duplicates = section(report, "duplicates")
    assert f"key='{twice.key().decode()}'" in duplicates
    assert f"found 2 at {pipeline.sink_topic}-1@{twice.offset()}, " in duplicates
    assert counts(report)["missing"] == counts(report)["unexpected"] == 0

    # A record the input never made.
    produce(pipeline.broker, pipeline.sink_topic, [("intruder", "NOT FROM THE INPUT", 0)])
    code, report = verify(capsys, config)
    assert code == 7, report
    assert (counts(report)["duplicates"], counts(report)["unexpected"]) == (1, 1), report
    assert "key='intruder'" in section(report, "unexpected")

    # Records lost: the start of a sink partition deleted (as a truncated range).
    partition = [m for m in output if m.partition() == 0]
    lost = partition[:3]
    delete_before(pipeline, 0, partition[3].offset())
    code, report = verify(capsys, config)
    assert code == 7, report
    assert (
        counts(report)["duplicates"],
        counts(report)["missing"],
        counts(report)["unexpected"],
    ) == (1, 3, 1), report
    missing = section(report, "missing")
    assert all(f"key='{m.key().decode()}'" in missing for m in lost), report
    # Record-wise SQL keeps provenance: each missing record says which input made it.
    assert f"from input {pipeline.source_topic}-" in missing

    # The same sink against input the pipeline never ran over: its output is missing.
    more = [(f"late{i}", f"w{i}", i % 2) for i in range(10)]
    produce(pipeline.broker, pipeline.source_topic, more)
    code, report = verify(capsys, config, "--to-offsets", "latest")
    assert code == 7, report
    assert counts(report)["records in"] == RECORDS + 10
    assert counts(report)["missing"] == 3 + sum(not v.endswith("7") for _, v, _ in more)


def clean_impression(n: int) -> tuple[str, str, int]:
    """Clean impression ``n``: one every 2 s of event time, over three campaigns."""
    campaign = f"c-{n % 3}"
    at = BASE_TIME + timedelta(seconds=2 * n)
    event = {
        "impression_id": f"i-{n}",
        "campaign_id": campaign,
        "event_time": at.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        "placement": "top",
    }
    return f"i-{n}", json.dumps(event), n % 2


@pytest.mark.slow
def test_windows_of_a_stateful_count_verify_once_each_with_the_recounted_value(
    make_pipeline: PipelineFactory, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example count per campaign per minute (append, watermark 30 s): each window the
    watermark closed is in the sink once with its count; a wrong count is caught."""
    pipeline = make_pipeline(source_partitions=2, sink_partitions=1)
    produce(pipeline.broker, pipeline.source_topic, (clean_impression(n) for n in range(300)))
    count = {
        "python": {"module": "eop_spark.examples.impressions", "function": "count_impressions"}
    }
    run_config = pipeline.config(
        source=batched_source(pipeline, 100),
        transform=count | {"outputMode": "append"},
    )
    runner = pipeline.start(run_config)  # processingTime, as in production
    # Event time runs 0-598 s: the watermark (30 s) closes 9 one-minute windows per campaign.
    closed = 3 * 9
    runner.wait_for("the closed windows", lambda: len(pipeline.output()) >= closed, 240)
    runner.terminate()
    assert runner.wait(120) == 0, runner.tail()
    config = pipeline.write_config(run_config, "verify.json")
    windows = read_committed_messages(pipeline.broker, pipeline.sink_topic)
    assert len(windows) == closed
    assert {json.loads(w.value())["impressions"] for w in windows} == {10}
    code, report = verify(capsys, config)
    assert code == 0, report
    assert counts(report)["records in"] == 300
    assert counts(report)["expected out"] == counts(report)["found in sink"] == closed
    assert "windows the watermark closed" in report

    # A window published again with a wrong count.
    window = json.loads(windows[0].value())
    wrong = json.dumps(window | {"impressions": window["impressions"] + 1}, separators=(",", ":"))
    produce(pipeline.broker, pipeline.sink_topic, [(window["campaign_id"], wrong, 0)])
    code, report = verify(capsys, config)
    assert code == 7, report
    assert counts(report)["unexpected"] == 1, report
    assert f'"impressions":{window["impressions"] + 1}' in section(report, "unexpected")


#: A count per key in output mode update: every micro-batch re-emits the counts it changed.
COUNTING = {
    "sql": "SELECT key, CAST(count(*) AS STRING) AS value FROM source GROUP BY key",
    "outputMode": "update",
}


@pytest.mark.slow
def test_the_last_value_per_key_of_an_update_mode_count_verifies_and_faults_are_reported(
    make_pipeline: PipelineFactory, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Output mode update: the sink's last record of each key holds the recounted final
    count (earlier updates are not compared); a later wrong value and a lost key are caught."""
    pipeline = make_pipeline(source_partitions=2, sink_partitions=1)
    # 'early' is in the first micro-batch only; k0-k4 are in every one (50 records a batch).
    records = [("early", "e", 0), *((f"k{i % 5}", "v", i % 2) for i in range(200))]
    produce(pipeline.broker, pipeline.source_topic, records)
    run_config = pipeline.config(
        source=batched_source(pipeline, 50),
        transform=COUNTING,
        trigger={"availableNow": True},
    )
    runner = pipeline.start(run_config)
    assert runner.wait(300) == 0, runner.tail()
    config = pipeline.write_config(run_config, "verify.json")
    output = read_committed_messages(pipeline.broker, pipeline.sink_topic)
    first_batch = {m.key().decode() for m in output[:6]}
    assert first_batch == {"early", "k0", "k1", "k2", "k3", "k4"}, output[:6]
    assert len(output) > 6 + 5  # later batches updated the counts
    code, report = verify(capsys, config)
    assert code == 0, report
    assert counts(report) == dict.fromkeys(COUNTS, 0) | {
        "records in": len(records),
        "expected out": 6,
        "found in sink": 6,
    }
    assert "output mode update): the last value per key" in report
    # Output mode complete re-emits every row each batch: its last records are the same table.
    complete = run_config | {"transform": COUNTING | {"outputMode": "complete"}}
    code, report = verify(capsys, pipeline.write_config(complete, "complete.json"))
    assert code == 0, report
    assert "output mode complete): the last value per key" in report

    # A later record of a key with another value, outside the pipeline's transactions.
    produce(pipeline.broker, pipeline.sink_topic, [("k3", "999", 0)])
    code, report = verify(capsys, config)
    assert code == 7, report
    assert (counts(report)["missing"], counts(report)["unexpected"]) == (1, 1), report
    assert "key='k3' value='40': expected 1, found 0" in section(report, "missing")
    at = read_committed_messages(pipeline.broker, pipeline.sink_topic)[-1].offset()
    unexpected = section(report, "unexpected")
    assert (
        f"key='k3' value='999': expected 0, found 1 at {pipeline.sink_topic}-0@{at}" in unexpected
    )

    # A key lost: the first micro-batch's records deleted, the only ones of 'early'.
    delete_before(pipeline, 0, output[6].offset())
    code, report = verify(capsys, config)
    assert code == 7, report
    assert (counts(report)["missing"], counts(report)["unexpected"]) == (2, 1), report
    assert counts(report)["found in sink"] == 5
    assert "key='early' value='1': expected 1, found 0" in section(report, "missing")


def test_update_mode_queries_whose_key_names_no_row_are_refused_naming_transform(
    make_pipeline: PipelineFactory, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The last value per key needs a key, one value per key and micro-batch."""
    pipeline = make_pipeline(source_partitions=1, sink_partitions=1)
    # k0 once, k1 twice, ...: four different counts.
    records = [(f"k{i}", "v", 0) for i in range(4) for _ in range(i + 1)]
    produce(pipeline.broker, pipeline.source_topic, records)
    keyless = "SELECT CAST(count(*) AS STRING) AS value FROM source GROUP BY key"
    transform = {"sql": keyless, "outputMode": "update"}
    config = pipeline.write_config(pipeline.config(transform=transform), "keyless.json")
    code, report = verify(capsys, config, "--to-offsets", "latest")
    assert code == 2, report
    assert (
        "eop: error: transform: eop verify reads output mode update as the last value per key, "
        "and the query's output has no key column" in report
    )

    # Four counts (one per source key) under one Kafka key: which is last depends on order.
    coarse = "SELECT 'all' AS key, CAST(count(*) AS STRING) AS value FROM source GROUP BY key"
    transform = {"sql": coarse, "outputMode": "update"}
    config = pipeline.write_config(pipeline.config(transform=transform), "coarse.json")
    code, report = verify(capsys, config, "--to-offsets", "latest")
    assert code == 2, report
    assert "eop: error: transform: " in report
    assert "key 'all' has 4 values in one micro-batch: the key must name the row" in report
