"""The driver's histograms: batch duration and transaction time, in valid Prometheus text."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from eop_spark.exactly_once.batch_result import BatchResult, BatchStatus
from eop_spark.runtime.metrics import Counters


def batch(txn_ms: float, transactions: int = 1) -> BatchResult:
    status = BatchStatus.COMMITTED if transactions else BatchStatus.SKIPPED
    return BatchResult(0, "coordinated", status, 10, {}, txn_ms, transactions=transactions)


def samples(text: str) -> dict[tuple[str, str], float]:
    """(sample name, le) -> value, for every family the text parser accepts."""
    return {
        (s.name, s.labels.get("le", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_batch_and_transaction_histograms() -> None:
    counters = Counters()
    counters.record(batch(40.0), seconds=0.3)
    counters.record(batch(2000.0), seconds=7.0)
    counters.record(batch(0.0, transactions=0), seconds=0.01)  # a replay: no transaction
    counters.record(batch(5.0))  # not timed
    found = samples(counters.render_prometheus("ns.p"))

    assert found[("eop_batch_duration_seconds_count", "")] == 3
    assert found[("eop_batch_duration_seconds_sum", "")] == 7.31
    assert found[("eop_batch_duration_seconds_bucket", "0.05")] == 1
    assert found[("eop_batch_duration_seconds_bucket", "0.5")] == 2
    assert found[("eop_batch_duration_seconds_bucket", "5.0")] == 2
    assert found[("eop_batch_duration_seconds_bucket", "10.0")] == 3
    assert found[("eop_batch_duration_seconds_bucket", "+Inf")] == 3

    assert found[("eop_transaction_seconds_count", "")] == 3  # batches with transactions
    assert found[("eop_transaction_seconds_bucket", "0.05")] == 2
    assert found[("eop_transaction_seconds_bucket", "2.5")] == 3
    # The counters are still there, next to the histograms.
    assert found[("eop_producers_fenced_total", "")] == 0
    assert found[("eop_rows_out_total", "")] == 40
