"""The transactional producer's errors: what a broker that stays away costs a batch."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devenv.kafka import KafkaBroker
from eop_spark.contract.errors import BrokerUnavailable, SinkRetryable
from eop_spark.contract.progress_names import ProgressNames
from eop_spark.kafka import transactional_producer
from eop_spark.kafka.transactional_producer import OVERRUN_S, TransactionalProducer

#: Nothing listens here: every call times out with librdkafka's retriable ``_TIMED_OUT``.
NOBODY = "127.0.0.1:9"


def test_a_broker_away_past_the_call_timeout_fails_the_batch_not_the_runner() -> None:
    """A coordinator that is restarting for longer than the call's timeout (a rolling restart
    on a busy cluster) leaves an error the batch may retry with a new producer; it does not
    stop the runner."""
    with pytest.raises(SinkRetryable, match=r"init_transactions .*_TIMED_OUT"):
        TransactionalProducer({"bootstrap.servers": NOBODY, "transactional.id": "t"}, timeout=1)


@contextlib.contextmanager
def send_offsets_blocked(producer: TransactionalProducer) -> Iterator[None]:
    """``producer``'s send_offsets_to_transaction blocks until the block ends (as librdkafka's
    can while G's coordinator is away); then the producer is closed."""
    release = threading.Event()
    real = producer._producer

    class Blocked:
        def send_offsets_to_transaction(self, *_: Any) -> None:
            release.wait()

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    producer._producer = Blocked()
    try:
        yield
        producer.close()
    finally:
        release.set()


@pytest.mark.kafka
def test_a_call_blocked_past_its_timeout_gives_the_producer_up(
    kafka_broker: KafkaBroker, kafka_topic: str
) -> None:
    """librdkafka's send_offsets_to_transaction can block past its timeout once G's
    coordinator went away (confluentinc/librdkafka#5456, #5511): the batch fails in time, and
    the producer is given up (a new one fences it)."""
    conf = kafka_broker.client_config({"transactional.id": f"t-{uuid.uuid4().hex[:8]}"})
    producer = TransactionalProducer(conf, timeout=30)
    with send_offsets_blocked(producer):
        producer.begin()
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable, match=r"blocked for .* past its timeout"):
            producer.send_offsets({(kafka_topic, 0): 1}, None, names=ProgressNames("g"), timeout=1)
        assert time.monotonic() - started < 1 + OVERRUN_S + 2
        assert not producer.usable


@pytest.mark.kafka
def test_calls_inside_a_transaction_retry_no_longer_than_it_lives(
    kafka_broker: KafkaBroker, kafka_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its transaction.timeout.ms the broker aborts a transaction: a call in it that keeps
    meeting retriable errors (a sink partition without enough in-sync replicas, G's
    coordinator away) gives the attempt up then, not after CALL_TIMEOUT_S, so the batch is
    retried (a new producer) as soon as the broker is back."""
    monkeypatch.setattr(transactional_producer, "IN_TRANSACTION_FLOOR_S", 0.5)
    monkeypatch.setattr(transactional_producer, "OVERRUN_S", 0.5)
    conf = kafka_broker.client_config(
        {"transactional.id": f"t-{uuid.uuid4().hex[:8]}", "transaction.timeout.ms": 1500}
    )
    producer = TransactionalProducer(conf)
    with send_offsets_blocked(producer):
        producer.begin()
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable, match=r"blocked for [12]s, past its timeout"):
            producer.send_offsets({(kafka_topic, 0): 1}, None, names=ProgressNames("g"))
        assert time.monotonic() - started < 1.5 + 0.5 + 1
