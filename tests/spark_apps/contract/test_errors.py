"""Failures become one clear line, even after crossing Spark tasks and py4j."""

from __future__ import annotations

from eop_spark.contract.errors import (
    EXIT_CONFIG,
    EXIT_ENVIRONMENT,
    EXIT_RUNTIME,
    ConfigError,
    EnvironmentNotReady,
    PipelineFailed,
    ProducerFenced,
    SinkRetryable,
    from_failure,
    one_line,
)

TASK_FAILURE = """\
org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/x/task.py", line 120, in commit_partition
    producer.send_offsets({tp: until}, sink.group_metadata, task.marker, names=sink.progress)
eop_spark.contract.errors.ProducerFenced: send_offsets_to_transaction of transactional id \
'eop.p.t.0' failed: KafkaError{code=PRODUCER_FENCED}
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException
"""

WORKER_FAILURE = """\
org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown: \
Traceback (most recent call last):
  File "/x/worker.py", line 1920, in read_udfs
    import pyarrow as pa
ModuleNotFoundError: No module named 'pyarrow'
 SQLSTATE: 38000
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException
"""


def test_exit_codes_by_kind() -> None:
    assert ConfigError("x").exit_code == EXIT_CONFIG
    assert EnvironmentNotReady("x").exit_code == EXIT_ENVIRONMENT
    assert PipelineFailed("x").exit_code == EXIT_RUNTIME
    assert ProducerFenced("x").exit_code == EXIT_RUNTIME


def test_messages_are_one_line() -> None:
    assert ConfigError("a\n  b\tc").message == "a b c"
    assert one_line("x" * 700, limit=20) == "x" * 17 + "..."


def test_an_eop_error_raised_in_a_task_keeps_its_class() -> None:
    error = from_failure(RuntimeError(TASK_FAILURE))
    assert isinstance(error, ProducerFenced) and isinstance(error, SinkRetryable)
    assert error.message.startswith("send_offsets_to_transaction of transactional id 'eop.p.t.0'")


def test_other_python_failures_in_workers_report_the_exception_line() -> None:
    error = from_failure(RuntimeError(WORKER_FAILURE))
    assert type(error) is PipelineFailed
    assert error.message == "ModuleNotFoundError: No module named 'pyarrow'"


def test_eop_errors_pass_through() -> None:
    original = ConfigError("bad")
    assert from_failure(original) is original
    assert from_failure(ValueError("first\nsecond")).message == "first"
