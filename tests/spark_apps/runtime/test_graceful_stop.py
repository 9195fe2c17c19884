"""A graceful stop stops the query only once Spark recorded the last batch in its commit log."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from eop_spark.runtime import runner
from eop_spark.runtime.runner import await_commit_log


class _Query:
    """A streaming query whose last batch report arrives ``delay`` seconds from now."""

    def __init__(self, reported: int | None, later: int, delay: float) -> None:
        self.progress = None if reported is None else {"batchId": reported}
        self.isActive = True
        threading.Timer(delay, self._report, args=(later,)).start()

    def _report(self, batch_id: int) -> None:
        self.progress = {"batchId": batch_id}

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        return self.progress


def test_the_stop_waits_for_spark_to_report_the_batch_the_sink_committed() -> None:
    query = _Query(reported=4, later=5, delay=0.5)
    began = time.monotonic()
    await_commit_log(query, 5)  # type: ignore[arg-type]
    assert time.monotonic() - began >= 0.45
    assert query.progress == {"batchId": 5}


def test_an_idle_trigger_report_of_a_later_batch_counts_and_no_batch_waits_for_nothing() -> None:
    query = _Query(reported=7, later=8, delay=5)
    began = time.monotonic()
    await_commit_log(query, 6)  # type: ignore[arg-type]
    await_commit_log(_Query(reported=None, later=0, delay=5), None)  # type: ignore[arg-type]
    assert time.monotonic() - began < 1


def test_a_query_that_ended_or_never_reports_does_not_hold_the_stop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ended = _Query(reported=None, later=0, delay=5)
    ended.isActive = False
    began = time.monotonic()
    await_commit_log(ended, 3)  # type: ignore[arg-type]
    assert time.monotonic() - began < 1
    monkeypatch.setattr(runner, "COMMIT_LOG_WAIT_S", 0.3)
    await_commit_log(_Query(reported=2, later=2, delay=0), 3)  # type: ignore[arg-type]
    assert "did not record batch 3" in caplog.text
