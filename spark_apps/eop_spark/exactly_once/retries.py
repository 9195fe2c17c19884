"""Retrying a batch's sink work after failures a fresh attempt can fix.

A micro-batch DataFrame can be recomputed (Spark re-reads the same offset
ranges), and the sinks skip what the progress group already holds, so
re-running a batch whose transaction was aborted or whose producer was fenced
is safe.  Anything else is fatal and stops the query.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from eop_spark.contract.errors import EopError, SinkRetryable, from_failure

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Attempts of one batch's sink work before the runner gives up (and Kubernetes restarts it).
MAX_ATTEMPTS = 4


def with_attempts(
    what: str,
    attempt: Callable[[int], T],
    *,
    attempts: int = MAX_ATTEMPTS,
    on_retry: Callable[[EopError], None] | None = None,
) -> T:
    """Run ``attempt(n)`` for n = 0, 1, ... until it succeeds or fails for good.

    Only :class:`~eop_spark.contract.errors.SinkRetryable` failures (including those
    raised inside Spark tasks) are retried, with a short backoff; the error
    raised at the end is always an :class:`~eop_spark.contract.errors.EopError`.
    """
    for number in range(attempts):
        try:
            return attempt(number)
        except Exception as exc:
            error = from_failure(exc)
            if not isinstance(error, SinkRetryable) or number + 1 == attempts:
                raise error from exc
            log.warning("%s: attempt %d failed, retrying: %s", what, number + 1, error)
            if on_retry is not None:
                on_retry(error)
            time.sleep(min(0.5 * 2**number, 5.0))
    raise AssertionError("unreachable")
