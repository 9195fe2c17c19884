"""The reason token of the runner's termination message: what the operator acts on."""

from __future__ import annotations

import pytest

from eop_spark.contract.errors import ConfigError, EnvironmentNotReady, PipelineFailed
from eop_spark.contract.termination import FailureReason, failure_line, parse_failure_line


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (
            ConfigError(
                "the query cannot start: Provided schema doesn't match to the schema for "
                "existing state! Please note that Spark allow difference of field name"
            ),
            FailureReason.INCOMPATIBLE_CHECKPOINT,
        ),
        (
            PipelineFailed(
                "the streaming query failed: There are [1] sources in the checkpoint offsets "
                "and now there are [2] sources requested by the query. Cannot continue."
            ),
            FailureReason.INCOMPATIBLE_CHECKPOINT,
        ),
        (
            PipelineFailed("[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] Provided key schema"),
            FailureReason.INCOMPATIBLE_CHECKPOINT,
        ),
        (
            PipelineFailed("java.lang.IllegalStateException: Log file was malformed: failed"),
            FailureReason.CORRUPT_CHECKPOINT,
        ),
        (ConfigError("transform.sql: syntax error"), FailureReason.CONFIG_ERROR),
        (EnvironmentNotReady("topic raw does not exist"), FailureReason.ENVIRONMENT),
        (PipelineFailed("fenced by another runner"), FailureReason.FAILED),
    ],
)
def test_failures_carry_a_reason_the_operator_can_parse(error: Exception, reason: str) -> None:
    line = failure_line(error)  # type: ignore[arg-type]
    assert line.startswith(f"eop: error: [{reason}] ")
    parsed, message = parse_failure_line(line + "\n")
    assert parsed is reason and message == str(error)


def test_lines_without_a_known_token_have_no_reason() -> None:
    assert parse_failure_line("eop: error: plain message") == (None, "plain message")
    assert parse_failure_line("eop: error: [Nope] x") == (None, "[Nope] x")
    assert parse_failure_line(None) == (None, "")
