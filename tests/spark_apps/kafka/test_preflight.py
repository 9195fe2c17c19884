"""What only the clusters can tell, refused before Spark starts (real broker, no Spark).

A sink topic the source reads from the same cluster, however the brokers are
written, and a transaction timeout above the brokers' maximum: each ends the
run with a configuration error (exit 2, the operator's ``ConfigError``) naming
the field, where without the check Spark would start and the pipeline would
read its own output, or fail at its first transaction.  The runs here are asked
to stop before Spark starts, so a check that lets a mistake through returns 0.
The runner's very line, as a driver's termination message, makes the operator
report the pipeline ``Degraded`` at once, naming the field.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from devenv.kafka import KafkaBroker
from devenv.kafka_cluster import KafkaCluster
from eop_operator.reconcile.upgrade import decide
from eop_spark.contract.errors import EXIT_CONFIG, EXIT_OK, ConfigError
from eop_spark.contract.run_config import RunConfig
from eop_spark.contract.spec import Duration
from eop_spark.contract.termination import failure_line
from eop_spark.kafka.preflight import Cluster, cluster, refuse_long_transactions
from eop_spark.runtime.runner import PipelineRun
from tests.operator.reconcile.test_upgrade import _between_crashes, situation, steady
from tests.plugins.kafka import TopicFactory

pytestmark = pytest.mark.kafka


def preflight(source: dict[str, Any], sink: dict[str, Any]) -> int:
    """Run a pipeline's checks (then stop before Spark): its exit code, raising on refusal."""
    config = RunConfig.model_validate(
        {
            "pipeline": "ns.p",
            "source": {"kafka": source},
            "transform": {"sql": "SELECT value FROM source"},
            "sink": {"kafka": sink},
            "transactionalIdPrefix": "eop.ns.p",
            "progressGroup": "eop.ns.p",
            "checkpointRoot": "/nowhere",
        }
    )
    stop = threading.Event()
    stop.set()
    return PipelineRun(config, stop).run()


def assert_reported(error: ConfigError, field: str) -> str:
    """The runner's failure line for ``error``, checked to reach the user naming ``field``:
    exit 2, and the operator's ``Degraded`` condition (no retry) quoting it."""
    assert error.exit_code == EXIT_CONFIG
    line = failure_line(error)
    assert line.startswith(f"eop: error: [ConfigError] {field} ")
    degraded = decide(situation(steady(), _between_crashes(1, line, seconds_ago=5))).degraded
    assert degraded is not None and degraded.reason == "ConfigError"
    assert f"restarting does not help: {field} " in degraded.message
    return line


@pytest.mark.parametrize(
    ("reads", "sink_servers", "field"),
    [
        ("topics", "localhost:{port}", "spec.source.kafka.topics"),
        ("pattern", "localhost:{port},127.0.0.1:{port}", "spec.source.kafka.topicPattern"),
    ],
)
def test_a_sink_the_source_reads_on_the_same_cluster_is_refused(
    kafka_broker: KafkaBroker,
    kafka_topic_factory: TopicFactory,
    reads: str,
    sink_servers: str,
    field: str,
) -> None:
    # The same broker by another host name (and listed twice): only the cluster id tells.
    prefix = f"own-{uuid.uuid4().hex[:8]}"
    source_topic, sink_topic = (
        kafka_topic_factory(prefix=prefix),
        kafka_topic_factory(prefix=prefix),
    )
    source: dict[str, Any] = {"bootstrapServers": kafka_broker.bootstrap_servers}
    if reads == "topics":
        source["topics"] = [source_topic, sink_topic]
    else:
        source["topicPattern"] = f"{prefix}-.*"
    sink = {"bootstrapServers": sink_servers.format(port=kafka_broker.port), "topic": sink_topic}

    with pytest.raises(ConfigError) as refused:
        preflight(source, sink)
    line = assert_reported(refused.value, "spec.sink.kafka.topic")
    assert f"spec.sink.kafka.topic {sink_topic!r} is read by" in line
    assert field in line and "on the same Kafka cluster (cluster id " in line
    assert "read its own output" in line

    # A pattern that does not read the sink topic passes.
    source.pop("topics", None)
    source["topicPattern"] = source_topic
    assert preflight(source, sink) == EXIT_OK


def test_the_same_cluster_is_told_by_id_not_by_servers() -> None:
    def described(servers: str, cluster_id: str | None) -> Cluster:
        return Cluster(role="sink", servers=servers, id=cluster_id, topics={})

    assert described("a:9092,b:9092", "x").same_as(described("b:9092,a:9092", "x"))
    assert not described("a:9092", "x").same_as(described("a:9092", "y"))
    assert described("a:9092", None).same_as(described("a:9092", "x"))
    assert not described("a:9092", None).same_as(described("b:9092", "x"))


def test_a_transaction_timeout_above_the_brokers_maximum_is_refused(
    kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory
) -> None:
    # The broker keeps Kafka's default transaction.max.timeout.ms: 15 minutes.
    source_topic, sink_topic = kafka_topic_factory(), kafka_topic_factory()
    source = {"bootstrapServers": kafka_broker.bootstrap_servers, "topics": [source_topic]}
    sink = {"bootstrapServers": kafka_broker.bootstrap_servers, "topic": sink_topic}

    with pytest.raises(ConfigError) as refused:
        preflight(source, sink | {"transactionTimeout": "16m"})
    line = assert_reported(refused.value, "spec.sink.kafka.transactionTimeout")
    assert "spec.sink.kafka.transactionTimeout 16m" in line
    assert "(960000 ms) is above transaction.max.timeout.ms 900000" in line

    assert preflight(source, sink | {"transactionTimeout": "15m"}) == EXIT_OK


def test_every_broker_of_a_cluster_is_asked_for_its_maximum(kafka_cluster: KafkaCluster) -> None:
    # librdkafka takes one broker per request: each of the three is asked in its own.
    conf = kafka_cluster.client_config()
    sink = cluster(conf, "sink")
    assert len(sink.brokers) == 3
    with pytest.raises(ConfigError, match=r"\(960000 ms\) is above transaction.max.timeout.ms"):
        refuse_long_transactions(conf, sink, Duration("16m"))
    refuse_long_transactions(conf, sink, Duration("15m"))
