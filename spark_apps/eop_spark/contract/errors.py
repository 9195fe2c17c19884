"""The runner's failures and the process exit codes they map to.

Exit codes of ``python -m eop_spark run`` (and of :func:`eop_spark.runtime.runner.run`):

====  =====================================================================
0     stopped as asked (SIGTERM, or ``trigger.availableNow`` ran out of input)
1     unexpected failure (a bug: the traceback is logged)
2     configuration error: the run config, the transform (SQL, missing ``value``),
      a commit mode the query cannot use.  Restarting does not help.
3     environment not ready: Kafka unreachable, a topic missing, connector
      jars missing.  Restarting later may help.
4     the pipeline failed while running: a Kafka or Spark error, fenced by
      another runner, progress group inconsistent with the checkpoint, or the
      checkpoint lost (every generation gone while G holds progress).
5     progress missing: a new checkpoint generation found no progress in G for
      partitions the pipeline committed before (expired or deleted offsets);
      starting them from ``startingOffsets`` would repeat or skip output.
6     state would restart empty: a new checkpoint generation of a stateful
      query while G holds progress; its state (open windows, counts) is gone.
7     ``eop verify`` only: the sink differs from the output recomputed from
      the input (duplicates, missing or unexpected records).
====  =====================================================================

Every failure is reported as ONE line, ``eop: error: <message>``, on stderr and
in ``$EOP_TERMINATION_LOG`` when set (Kubernetes shows it as the pod's
termination message).
"""

from __future__ import annotations

import re

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_CONFIG = 2
EXIT_ENVIRONMENT = 3
EXIT_RUNTIME = 4
EXIT_PROGRESS_MISSING = 5
EXIT_STATE_LOST = 6
EXIT_DISCREPANCIES = 7


class EopError(Exception):
    """A failure with a one-line message meant for the user."""

    exit_code = EXIT_UNEXPECTED

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))

    @property
    def message(self) -> str:
        """The one-line message."""
        return str(self)


class ConfigError(EopError):
    """The configuration or the transform is invalid; restarting does not help."""

    exit_code = EXIT_CONFIG


class EnvironmentNotReady(EopError):
    """Something outside the pipeline is missing: a broker, a topic, the connector jars."""

    exit_code = EXIT_ENVIRONMENT


class PipelineFailed(EopError):
    """The running pipeline hit an error it cannot recover from in-process."""

    exit_code = EXIT_RUNTIME


class SinkRetryable(PipelineFailed):
    """A sink transaction failed in a way that a fresh attempt of the batch may fix."""


class ProducerFenced(SinkRetryable):
    """Another process initialised our transactional id: our producer is dead."""


class BrokerUnavailable(SinkRetryable):
    """A broker the batch needs stayed away through a call's retries.

    Retriable Kafka errors (a partition without enough in-sync replicas, a leader
    or coordinator moving, a request timing out) outlasted the call, or its
    transaction: the batch is retried in place for longer than after other
    failures (:mod:`eop_spark.exactly_once.retries`).
    """


class TransactionTimedOut(SinkRetryable):
    """A sink transaction outlived the transaction timeout (the broker aborts such a one)."""


class ProgressConflict(PipelineFailed):
    """The progress group disagrees with the checkpoint in a way that would duplicate output."""


class CheckpointLost(EopError):
    """The checkpoint root lost every generation while G holds progress (files or objects
    deleted): a new generation from G repairs it."""

    exit_code = EXIT_RUNTIME


class ProgressMissing(EopError):
    """A new generation found no progress for partitions the pipeline committed before."""

    exit_code = EXIT_PROGRESS_MISSING


class StateLost(EopError):
    """A new generation of a stateful query would restart its state empty."""

    exit_code = EXIT_STATE_LOST


def one_line(text: str, limit: int = 600) -> str:
    """Collapse ``text`` to one line of at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def from_failure(exc: BaseException) -> EopError:
    """The user-facing error for ``exc``, which may have crossed Spark (task or py4j).

    An :class:`EopError` raised in a Spark task reaches the driver as text inside
    a Java exception; its class and message are recovered from that text so the
    caller can tell retryable sink failures from fatal ones.
    """
    if isinstance(exc, EopError):
        return exc
    text = str(exc)
    found = _RAISED_IN_TASK.findall(text)
    if found:
        name, message = found[-1]
        kind = _ERRORS_BY_NAME.get(name, PipelineFailed)
        return kind(message)
    message = _python_exception_line(text) or _first_line(text) or type(exc).__name__
    return PipelineFailed(message)


def _python_exception_line(text: str) -> str:
    """The ``Type: message`` line closing the last Python traceback inside ``text``."""
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return ""
    line = ""
    for candidate in text[start:].splitlines()[1:]:
        if candidate.startswith(("\tat ", " SQLSTATE")) or candidate.strip().startswith("at "):
            break
        if candidate and not candidate.startswith(" "):
            line = candidate
    return line.strip()


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


#: How an EopError raised in a Spark task reads in the text that reaches the driver (the
#: JVM writer raises its errors under the same names, see PartitionedWriter.java).
_RAISED_IN_TASK = re.compile(r"eop_spark\.contract\.errors\.(\w+): ([^\n]*)")
_ERRORS_BY_NAME: dict[str, type[EopError]] = {
    cls.__name__: cls
    for cls in (
        EopError,
        ConfigError,
        EnvironmentNotReady,
        PipelineFailed,
        SinkRetryable,
        BrokerUnavailable,
        ProducerFenced,
        TransactionTimedOut,
        ProgressConflict,
        CheckpointLost,
        ProgressMissing,
        StateLost,
    )
}


def after_transaction(
    error: BaseException, what: str, open_s: float, timeout_ms: int
) -> BaseException:
    """``error`` of a transaction open ``open_s`` seconds, named for its timeout if it outlived it.

    The broker aborts a transaction older than ``transaction.timeout.ms``; the
    producer then fails with a fencing or epoch error that says nothing of
    time.  Other errors (configuration, the query, a bug) pass as they are, and so
    does :class:`BrokerUnavailable`: a transaction open past its timeout because a
    broker was away is not too big.
    """
    if (
        not isinstance(error, SinkRetryable)
        or isinstance(error, BrokerUnavailable)
        or open_s * 1000.0 < timeout_ms
    ):
        return error
    return TransactionTimedOut(
        f"{what} was open {open_s * 1000.0:.0f} ms, longer than sink.kafka.transactionTimeout "
        f"({timeout_ms} ms), and the broker aborts such a transaction: raise "
        "sink.kafka.transactionTimeout or make batches smaller with "
        f"source.kafka.maxOffsetsPerTrigger ({type(error).__name__}: {error})"
    )
