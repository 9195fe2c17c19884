"""Reading the progress group G while its coordinator is away."""

from __future__ import annotations

import pytest

from eop_spark.contract.errors import SinkRetryable
from eop_spark.contract.progress_names import ProgressNames
from eop_spark.exactly_once.progress_group import ProgressGroup


def test_a_coordinator_away_past_the_timeout_fails_the_batch_not_the_runner() -> None:
    """G's coordinator gone for longer than the read's timeout (a broker restarting) is an
    error the batch may retry, not a reason to stop the runner."""
    group = ProgressGroup(ProgressNames("eop.test.p"), {"bootstrap.servers": "127.0.0.1:9"})
    try:
        with pytest.raises(SinkRetryable, match=r"cannot read progress group .* within 1s"):
            group.read([("events", 0)], timeout=1)
    finally:
        group.close()
