"""Machine-readable reasons in the termination message, for the operator.

The runner reports a failure as one line, ``eop: error: [<Reason>] <message>``.
The reason token is a stable API between the data plane and the operator:
the operator falls back to a new checkpoint generation on
``IncompatibleCheckpoint``, recovers from ``CorruptCheckpoint`` and
``CheckpointLost`` the same way, and stops retrying on ``ConfigError``.
Spark's own errors are recognised by their text, since they cross py4j as
strings.
"""

from __future__ import annotations

import re
from enum import StrEnum

from eop_spark.contract.errors import CheckpointLost, ConfigError, EnvironmentNotReady, EopError

#: The prefix of every failure line the runner writes.
FAILURE_PREFIX = "eop: error: "


class FailureReason(StrEnum):
    """Why a runner stopped with an error."""

    #: The checkpoint cannot serve the new query (state schema, operators, sources changed).
    INCOMPATIBLE_CHECKPOINT = "IncompatibleCheckpoint"
    #: The checkpoint cannot be read (truncated or malformed files).
    CORRUPT_CHECKPOINT = "CorruptCheckpoint"
    #: The checkpoint root lost every generation while G holds progress (deleted).
    CHECKPOINT_LOST = "CheckpointLost"
    #: The configuration or the transform is invalid: restarting does not help.
    CONFIG_ERROR = "ConfigError"
    #: Kafka, a topic or the connector jars are missing: restarting later may help.
    ENVIRONMENT = "EnvironmentNotReady"
    #: Anything else.
    FAILED = "Failed"


# Spark's messages (3.5 and 4.x) when a checkpoint does not fit the query.
_INCOMPATIBLE = re.compile(
    r"Provided schema doesn't match|StateSchemaNotCompatible|SCHEMA_NOT_COMPATIBLE"
    r"|sources in the checkpoint offsets and now there are"
    r"|STREAMING_STATEFUL_OPERATOR_NOT_MATCH|STATE_STORE_.*NOT_COMPATIBLE"
    r"|INCOMPATIBLE_DATA_FOR_STATE|not compatible with the checkpoint"
    r"|number of (state )?operators|stateful operator.*(changed|mismatch)",
    re.IGNORECASE,
)
_CORRUPT = re.compile(
    r"Log file was malformed|Incomplete log file|UnsupportedLogVersion"
    r"|Error reading (delta|snapshot) file|CANNOT_READ_(DELTA|SNAPSHOT)_FILE"
    r"|checkpoint.*corrupt|corrupt.*checkpoint|CheckpointFormatError",
    re.IGNORECASE,
)
_TOKEN = re.compile(r"^\[(\w+)\]\s*")


def failure_reason(error: EopError) -> FailureReason:
    """Classify a runner failure for the operator."""
    text = error.message
    if isinstance(error, CheckpointLost):
        return FailureReason.CHECKPOINT_LOST
    if _INCOMPATIBLE.search(text):
        return FailureReason.INCOMPATIBLE_CHECKPOINT
    if _CORRUPT.search(text):
        return FailureReason.CORRUPT_CHECKPOINT
    if isinstance(error, ConfigError):
        return FailureReason.CONFIG_ERROR
    if isinstance(error, EnvironmentNotReady):
        return FailureReason.ENVIRONMENT
    return FailureReason.FAILED


def failure_line(error: EopError) -> str:
    """The one line reported on stderr and in the termination log."""
    return f"{FAILURE_PREFIX}[{failure_reason(error).value}] {error.message}"


def parse_failure_line(text: str | None) -> tuple[FailureReason | None, str]:
    """The reason and the message of a termination message (None: not the runner's line)."""
    line = (text or "").strip().splitlines()[-1:] or [""]
    message = line[0].removeprefix(FAILURE_PREFIX)
    match = _TOKEN.match(message)
    if match is None:
        return None, message
    try:
        reason = FailureReason(match.group(1))
    except ValueError:
        return None, message
    return reason, message[match.end() :]
