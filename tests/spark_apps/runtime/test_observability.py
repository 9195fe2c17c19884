"""The batch log line (text and JSON) and the counters with their text endpoint."""

from __future__ import annotations

import json
import logging
import urllib.request

import pytest

from eop_spark.exactly_once.batch_result import BatchResult, BatchStatus
from eop_spark.runtime.batch_log import JsonFormatter, log_batch
from eop_spark.runtime.metrics import Counters, serve_metrics


def result(status: str = BatchStatus.COMMITTED) -> BatchResult:
    return BatchResult(
        batch_id=7,
        mode="partitioned",
        status=status,
        rows_out=90,
        offsets={("in", 1): 20, ("in", 0): 10},
        txn_ms=12.34,
        transactions=2,
        rows_in=100,
        committed_at=1000.0,
    )


def test_batch_line_in_json(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.batch")
    with caplog.at_level(logging.INFO, logger="test.batch"):
        log_batch(logger, result())
    record = caplog.records[-1]
    data = json.loads(JsonFormatter().format(record))
    assert data["event"] == "batch"
    assert data["batch_id"] == 7 and data["mode"] == "partitioned"
    assert data["rows_in"] == 100 and data["rows_out"] == 90
    assert data["offsets"] == '{"in":{"0":10,"1":20}}'
    assert data["status"] == "committed" and data["txn_ms"] == 12.3
    assert record.getMessage().startswith("batch 7 committed (partitioned): rows in 100, out 90")


def test_counters_and_their_endpoint() -> None:
    counters = Counters()
    counters.record(result())
    counters.record(result(BatchStatus.SKIPPED))
    counters.add_rows_in(100)
    snapshot = counters.snapshot()
    assert snapshot["batches_committed"] == 1 and snapshot["batches_skipped"] == 1
    assert snapshot["rows_out"] == 180 and snapshot["transactions_committed"] == 4
    server = serve_metrics(counters, 'ns."p"', 0)
    try:
        port = server.server_address[1]
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        server.shutdown()
    text = body.decode()
    assert "# TYPE eop_rows_out_total counter" in text
    assert 'eop_rows_out_total{pipeline="ns.\\"p\\""} 180' in text
    assert 'eop_commit_seconds_total{pipeline="ns.\\"p\\""}' in text
