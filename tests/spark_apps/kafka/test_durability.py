"""The durability floors of the sink and progress topics, on real brokers (no Spark).

On the shared 3-broker cluster a topic kept in fewer copies than the floors
is refused by name (or only logged, when the pipeline says ``warn``), and the
progress topics eop creates keep the floors themselves; on one broker,
where one copy is all there is, nothing is refused.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, ResourceType

from devenv.kafka import KafkaBroker
from devenv.kafka_cluster import KafkaCluster
from eop_spark.contract.errors import EnvironmentNotReady
from eop_spark.contract.progress_names import ProgressNames
from eop_spark.contract.run_config import RunConfig
from eop_spark.contract.spec import Durability
from eop_spark.exactly_once.cross_cluster import ProgressTopics
from eop_spark.kafka.durability import Floors, check_topics, floors, new_topic_settings
from eop_spark.runtime.runner import PipelineRun

pytestmark = pytest.mark.kafka


@pytest.fixture
def cluster_topics(kafka_cluster: KafkaCluster) -> Iterator[list[str]]:
    """Names of topics the test creates on the shared cluster; deleted after it."""
    names: list[str] = []
    yield names
    for name in names:
        kafka_cluster.delete_topic(name)


def test_the_floors_follow_the_cluster_size() -> None:
    assert [floors(n) for n in (1, 2, 3, 5)] == [
        Floors(1, 1),
        Floors(2, 2),
        Floors(3, 2),
        Floors(3, 2),
    ]
    assert new_topic_settings(1) == (-1, {})
    assert new_topic_settings(5) == (3, {"min.insync.replicas": "2"})


def test_a_sink_topic_below_the_floors_is_refused_by_name(
    kafka_cluster: KafkaCluster, cluster_topics: list[str]
) -> None:
    single, lenient, durable = (f"out-{kind}-{uuid.uuid4().hex[:8]}" for kind in "sld")
    kafka_cluster.create_topic(single, 1, replication_factor=1)
    kafka_cluster.create_topic(lenient, 1, config={"min.insync.replicas": "1"})
    kafka_cluster.create_topic(durable, 1)
    cluster_topics.extend([single, lenient, durable])
    conf = kafka_cluster.client_config()

    with pytest.raises(EnvironmentNotReady) as refused:
        check_topics(conf, {single: "sink topic"}, Durability.REFUSE)
    message = str(refused.value)
    assert f"sink topic {single} has replication factor 1 and min.insync.replicas 2" in message
    assert "cluster of 3 brokers" in message and "floor of 3 and 2" in message
    assert "sink.kafka.durability" in message

    warned = check_topics(conf, {lenient: "sink topic"}, Durability.WARN)
    assert len(warned) == 1
    assert f"sink topic {lenient} has replication factor 3 and min.insync.replicas 1" in warned[0]
    assert check_topics(conf, {durable: "sink topic"}, Durability.REFUSE) == []


def run_config(cluster: KafkaCluster, sink_topic: str, **sink: Any) -> RunConfig:
    """A run config whose sink topic is ``sink_topic`` on ``cluster``."""
    servers = cluster.bootstrap_servers
    return RunConfig.model_validate(
        {
            "pipeline": "ns.p",
            "source": {"kafka": {"bootstrapServers": servers, "topics": ["in"]}},
            "transform": {"sql": "SELECT value FROM source"},
            "sink": {"kafka": {"bootstrapServers": servers, "topic": sink_topic} | sink},
            "transactionalIdPrefix": "eop.ns.p",
            "progressGroup": "eop.ns.p",
            "checkpointRoot": "/nowhere",
        }
    )


def test_the_runner_refuses_by_default_and_warns_when_told(
    kafka_cluster: KafkaCluster, cluster_topics: list[str]
) -> None:
    single = f"out-single-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(single, 1, replication_factor=1)
    cluster_topics.append(single)
    conf = kafka_cluster.client_config()
    refusing = PipelineRun(run_config(kafka_cluster, single), threading.Event())
    with pytest.raises(EnvironmentNotReady, match=f"sink topic {single} has replication factor 1"):
        refusing.check_durability(conf, [("in", 0)])
    warning = PipelineRun(run_config(kafka_cluster, single, durability="warn"), threading.Event())
    warning.check_durability(conf, [("in", 0)])  # logged, not raised


def test_progress_topics_are_created_at_the_floors(
    kafka_cluster: KafkaCluster, cluster_topics: list[str]
) -> None:
    names = ProgressNames(f"eop.test.{uuid.uuid4().hex[:8]}", progress_topics=True)
    conf = kafka_cluster.client_config()
    ProgressTopics(names, conf, "out").cover([("in", 0), ("in", 1)])
    topic = names.topic("in")  # left on the cluster: deleting it takes seconds

    admin = AdminClient({**conf, "log_level": 0})
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    assert [len(p.replicas) for p in partitions.values()] == [3, 3]
    resource = ConfigResource(ResourceType.TOPIC, topic)
    isr = admin.describe_configs([resource])[resource].result(timeout=10)["min.insync.replicas"]
    # Set on the topic itself: a cluster whose default is 1 gets 2 all the same.
    assert (isr.value, isr.source) == ("2", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert check_topics(conf, {topic: "progress topic"}, Durability.REFUSE) == []


def test_a_single_broker_is_never_refused(kafka_broker: KafkaBroker) -> None:
    name = f"out-single-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(name, 1, config={"min.insync.replicas": "1"})
    try:
        conf = kafka_broker.client_config()
        assert check_topics(conf, {name: "sink topic"}, Durability.REFUSE) == []
    finally:
        kafka_broker.delete_topic(name)
