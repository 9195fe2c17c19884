"""A transaction the broker aborted for its age is reported as that, with the settings to change."""

from __future__ import annotations

from typing import Any

from eop_spark.contract.errors import (
    BrokerUnavailable,
    ConfigError,
    PipelineFailed,
    ProducerFenced,
    SinkRetryable,
    TransactionTimedOut,
    after_transaction,
    from_failure,
)
from eop_spark.contract.run_config import RunConfig
from eop_spark.contract.spec import Duration
from eop_spark.contract.termination import failure_line
from eop_spark.exactly_once.coordinated import bounded_batches, default_batch_records

#: What a JVM writer task's failure looks like on the driver (PartitionedWriter.failure).
JVM_TASK_FAILURE = """\
org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 0.0 failed
io.exactlyonce.eop.PartitionedWriter$TaskFailure: eop_spark.contract.errors.TransactionTimedOut: \
the transaction of eop.p.in.1 was open 12040 ms, longer than sink.kafka.transactionTimeout (1000 \
ms), and the broker aborts such a transaction: raise sink.kafka.transactionTimeout or make \
batches smaller with source.kafka.maxOffsetsPerTrigger (InvalidProducerEpochException: \
Producer with epoch 3 is fenced)
\tat io.exactlyonce.eop.PartitionedWriter.failure(PartitionedWriter.java:640)
"""


def test_a_failure_after_the_timeout_names_both_settings_in_one_line() -> None:
    fenced = ProducerFenced("transactional id 'eop.p.driver' was fenced during commit_transaction")
    error = after_transaction(fenced, "the transaction of eop.p.driver", 2.5, 1000)
    assert isinstance(error, TransactionTimedOut) and isinstance(error, SinkRetryable)
    line = failure_line(error)
    assert "\n" not in line
    assert "was open 2500 ms, longer than sink.kafka.transactionTimeout (1000 ms)" in line
    assert "source.kafka.maxOffsetsPerTrigger" in line
    assert "ProducerFenced: transactional id 'eop.p.driver'" in line


def test_failures_within_the_timeout_or_not_the_sinks_pass_as_they_are() -> None:
    fenced = ProducerFenced("fenced")
    assert after_transaction(fenced, "t", 0.9, 1000) is fenced
    own = PipelineFailed("rows of another partition")
    assert after_transaction(own, "t", 5.0, 1000) is own
    config = ConfigError("bad")
    assert after_transaction(config, "t", 5.0, 1000) is config
    bug = RuntimeError("an error of the query")
    assert after_transaction(bug, "t", 5.0, 1000) is bug


def test_a_transaction_a_broker_kept_open_is_not_called_too_big() -> None:
    """Retriable errors (not enough in-sync replicas) kept the transaction open past its
    timeout: advising smaller batches would send the user the wrong way."""
    away = BrokerUnavailable("commit_transaction failed: NOT_ENOUGH_REPLICAS")
    assert after_transaction(away, "the transaction of eop.p.driver", 30.0, 2000) is away
    jvm = JVM_TASK_FAILURE.replace(
        "TransactionTimedOut: the transaction", "BrokerUnavailable: the transaction"
    )
    assert isinstance(from_failure(RuntimeError(jvm)), BrokerUnavailable)


def test_the_jvm_writers_timeout_failure_keeps_its_class_on_the_driver() -> None:
    error = from_failure(RuntimeError(JVM_TASK_FAILURE))
    assert isinstance(error, TransactionTimedOut)
    assert error.message.startswith("the transaction of eop.p.in.1 was open 12040 ms")
    assert "source.kafka.maxOffsetsPerTrigger" in error.message


def run_config(**kafka: Any) -> RunConfig:
    source = {"bootstrapServers": "127.0.0.1:9092", "topics": ["in"], **kafka.pop("source", {})}
    return RunConfig.model_validate(
        {
            "pipeline": "ns.p",
            "source": {"kafka": source},
            "transform": {"sql": "SELECT key, value FROM source"},
            "sink": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topic": "out", **kafka}},
            "transactionalIdPrefix": "eop.ns.p",
            "progressGroup": "eop.ns.p",
            "checkpointRoot": "/tmp/cp",
        }
    )


def test_coordinated_batches_are_bounded_from_the_timeout_unless_the_spec_bounds_them() -> None:
    assert default_batch_records(Duration("60s")) == 2_000_000
    assert default_batch_records(Duration("1s")) == 33_333
    bounded = bounded_batches(run_config(transactionTimeout="1s"))
    assert bounded.source.kafka.max_offsets_per_trigger == 33_333
    own = run_config(source={"maxOffsetsPerTrigger": 5_000_000})
    assert bounded_batches(own) is own
