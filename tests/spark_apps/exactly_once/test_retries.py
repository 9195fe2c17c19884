"""A batch's attempts: retried in place with back-off while a broker is away, then one error."""

from __future__ import annotations

import pytest

from eop_spark.contract.errors import (
    BrokerUnavailable,
    PipelineFailed,
    ProducerFenced,
    SinkRetryable,
    TransactionTimedOut,
)
from eop_spark.exactly_once import retries
from eop_spark.exactly_once.retries import MIN_ATTEMPTS, RETRY_WINDOW_S, with_attempts


class Clock:
    """time.monotonic and time.sleep of the retries module, with attempts that take time."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(retries, "time", fake)
    return fake


def failing(clock: Clock, error: Exception, failures: int, seconds: float = 2.0) -> list[int]:
    """The attempts made by a ``with_attempts`` whose first ``failures`` attempts raise."""
    made: list[int] = []

    def attempt(number: int) -> int:
        made.append(number)
        clock.now += seconds  # an aborted transaction: about the transaction timeout
        if number < failures:
            raise error
        return number

    assert with_attempts("batch 7", attempt) == failures
    return made


def test_a_broker_away_for_a_minute_costs_attempts_not_the_runner(clock: Clock) -> None:
    """With a 2 s transaction timeout, 4 attempts used to end within 15 s of an outage."""
    error = BrokerUnavailable("commit_transaction failed: 50 message(s) timed out")
    made = failing(clock, error, failures=12)
    assert len(made) == 13 and clock.now > 60
    assert max(clock.slept) == retries.MAX_BACKOFF_S
    assert clock.slept == sorted(clock.slept)  # the back-off grows


def test_the_runner_gives_up_after_the_window_with_one_line_naming_the_attempts(
    clock: Clock,
) -> None:
    def attempt(_: int) -> None:
        clock.now += 30.0
        raise BrokerUnavailable("commit_transaction failed: NOT_ENOUGH_REPLICAS")

    with pytest.raises(BrokerUnavailable) as raised:
        with_attempts("batch 7", attempt)
    assert RETRY_WINDOW_S <= clock.now < RETRY_WINDOW_S + 60
    assert str(raised.value) == (
        "commit_transaction failed: NOT_ENOUGH_REPLICAS (batch 7: 4 attempts failed over 124 s)"
    )


@pytest.mark.parametrize(
    "error",
    [
        TransactionTimedOut("the transaction of eop.p.driver was open 2500 ms, longer than"),
        ProducerFenced("transactional id 'eop.p.driver' was fenced: another runner"),
    ],
)
def test_a_batch_too_big_or_fenced_by_another_runner_stops_after_a_few_attempts(
    clock: Clock, error: SinkRetryable
) -> None:
    made: list[int] = []

    def attempt(number: int) -> None:
        made.append(number)
        clock.now += 2.5
        raise error

    with pytest.raises(type(error), match=f"batch 7: {MIN_ATTEMPTS} attempts failed"):
        with_attempts("batch 7", attempt)
    assert len(made) == MIN_ATTEMPTS


def test_other_failures_stop_at_once(clock: Clock) -> None:
    def attempt(_: int) -> None:
        raise PipelineFailed("rows of another partition")

    with pytest.raises(PipelineFailed, match=r"^rows of another partition$"):
        with_attempts("batch 7", attempt)
    assert clock.slept == []
