"""The transactional producer's errors: what a broker that stays away costs a batch."""

from __future__ import annotations

import pytest

from eop_spark.contract.errors import SinkRetryable
from eop_spark.kafka.transactional_producer import TransactionalProducer

#: Nothing listens here: every call times out with librdkafka's retriable ``_TIMED_OUT``.
NOBODY = "127.0.0.1:9"


def test_a_broker_away_past_the_call_timeout_fails_the_batch_not_the_runner() -> None:
    """A coordinator that is restarting for longer than the call's timeout (a rolling restart
    on a busy cluster) leaves an error the batch may retry with a new producer; it does not
    stop the runner."""
    with pytest.raises(SinkRetryable, match=r"init_transactions .*_TIMED_OUT"):
        TransactionalProducer({"bootstrap.servers": NOBODY, "transactional.id": "t"}, timeout=1)
