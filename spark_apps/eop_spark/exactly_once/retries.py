"""Retrying a batch's sink work after failures a fresh attempt can fix.

A micro-batch DataFrame can be recomputed (Spark re-reads the same offset
ranges), and the sinks skip what the progress group already holds, so
re-running a batch whose transaction was aborted or whose producer was fenced
is safe: the aborted transaction's output is invisible and G did not move.
Anything else is fatal and stops the query.

A retryable failure is retried in place :data:`MIN_ATTEMPTS` times.  A broker
that stays away (a partition without enough in-sync replicas, a leader or a
coordinator moving, a node restarting) fails one attempt after another, each
as soon as its calls' retries or its transaction's timeout run out
(:class:`~eop_spark.contract.errors.BrokerUnavailable`): once a batch met one,
it is retried, with a back-off growing to :data:`MAX_BACKOFF_S`, until
:data:`RETRY_WINDOW_S` have passed since its first attempt, however short the
transaction timeout (at most :data:`MAX_ATTEMPTS`).  Then the runner stops with
the last error, which says how many attempts failed over how long.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from eop_spark.contract.errors import BrokerUnavailable, EopError, SinkRetryable, from_failure

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Attempts of one batch's sink work before the runner gives up (and Kubernetes restarts it).
MIN_ATTEMPTS = 4
#: Attempts of one batch at the most, while a broker is away.
MAX_ATTEMPTS = 16
#: Seconds from a batch's first attempt during which a broker that is away costs attempts,
#: not the runner: longer than a node's restart or a coordinator's move takes.
RETRY_WINDOW_S = 120.0
#: The back-off before the second attempt, doubled for each further one up to
#: :data:`MAX_BACKOFF_S`.
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0


def backoff_s(number: int) -> float:
    """Seconds to wait after failed attempt ``number`` (0, 1, ...)."""
    return float(min(FIRST_BACKOFF_S * 2**number, MAX_BACKOFF_S))


def with_attempts(
    what: str,
    attempt: Callable[[int], T],
    *,
    on_retry: Callable[[EopError], None] | None = None,
) -> T:
    """Run ``attempt(n)`` for n = 0, 1, ... until it succeeds or fails for good.

    Only :class:`~eop_spark.contract.errors.SinkRetryable` failures (including those
    raised inside Spark tasks) are retried, with back-off, as the module says.
    The error raised at the end is always an
    :class:`~eop_spark.contract.errors.EopError`, of the last failure's class; after
    retries its message ends with how many attempts failed over how long.
    """
    started = time.monotonic()
    broker_away = False
    number = 0
    while True:
        try:
            return attempt(number)
        except Exception as exc:
            error = from_failure(exc)
            broker_away = broker_away or isinstance(error, BrokerUnavailable)
            attempts = number + 1
            patient = broker_away and time.monotonic() - started < RETRY_WINDOW_S
            retry = isinstance(error, SinkRetryable) and (
                attempts < MIN_ATTEMPTS or (patient and attempts < MAX_ATTEMPTS)
            )
            if not retry:
                if number == 0:
                    raise error from exc
                took = time.monotonic() - started
                raise type(error)(
                    f"{error} ({what}: {attempts} attempts failed over {took:.0f} s)"
                ) from exc
            log.warning("%s: attempt %d failed, retrying: %s", what, attempts, error)
            if on_retry is not None:
                on_retry(error)
            time.sleep(backoff_s(number))
            number += 1
