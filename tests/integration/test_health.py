"""Health from progress on a real broker and a real API server.

The operator runs as a subprocess with the chart's RBAC and reads the progress group ``G``
and the source's end offsets from a real Kafka broker. What a user sees:

* ``status.lag`` and ``status.progress.worstPartitions`` say what ``kafka-consumer-groups
  --describe`` says for ``G``;
* a driver that is Ready while input waits and ``G`` does not move is restarted (its pod is
  deleted and the StatefulSet recreates it) with a ``RestartStalled`` Warning event; a driver
  that is not Ready is left alone.

No kubelet runs at this tier: the test marks the driver pod Ready itself, as a kubelet would.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devenv.kafka import KafkaBroker, until_coordinator_ready
from devenv.kube import ControlPlane
from tests.integration.operators import OperatorProcess, install_chart
from tests.integration.test_operator_on_apiserver import _apply, _events, get, wait_for
from tests.plugins.kafka import SHORT_RETENTION_S, TopicFactory, consumer_groups_describe

pytestmark = [pytest.mark.kube, pytest.mark.kafka]

RELEASE = "eop-health"
NAMESPACE = "eop-health-system"


@pytest.fixture
def operator(
    control_plane: ControlPlane, kube_namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """``eop operator`` serving ``kube_namespace`` with the chart's RBAC."""
    kubeconfig = install_chart(control_plane, RELEASE, NAMESPACE)
    proc = OperatorProcess(kubeconfig, tmp_path / "operator.log", "--namespace", kube_namespace)
    try:
        wait_for(proc.alive, "the operator's liveness endpoint")
        yield proc
    finally:
        proc.stop()
        control_plane.helm("uninstall", RELEASE, "--namespace", NAMESPACE)
    assert "Forbidden" not in proc.text(), "the chart's RBAC was not enough"


def pipeline(name: str, broker: KafkaBroker, topic: str, **health: str) -> dict[str, Any]:
    """A pipeline reading ``topic``, its source settings partly from a Secret."""
    return {
        "apiVersion": "exactlyonce.io/v1alpha1",
        "kind": "ExactlyOncePipeline",
        "metadata": {"name": name},
        "spec": {
            "source": {
                "kafka": {
                    "bootstrapServers": broker.bootstrap_servers,
                    "topics": [topic],
                    "secretRef": {"name": f"{name}-kafka"},
                }
            },
            "transform": {"sql": "SELECT key, value FROM source"},
            "sink": {"kafka": {"bootstrapServers": broker.bootstrap_servers, "topic": "out"}},
            "health": health,
        },
    }


def kafka_secret(cp: ControlPlane, namespace: str, name: str) -> None:
    """A Secret with one harmless client property: the operator must read it to connect."""
    cp.kubectl(
        "create",
        "secret",
        "generic",
        f"{name}-kafka",
        "-n",
        namespace,
        "--from-literal=client.id=eop-health-test",
        check=True,
    )


def produce(broker: KafkaBroker, topic: str, per_partition: dict[int, int]) -> None:
    from confluent_kafka import Producer

    producer = Producer(broker.client_config())
    for partition, count in per_partition.items():
        for i in range(count):
            producer.produce(topic, value=f"{partition}-{i}".encode(), partition=partition)
    assert producer.flush(30) == 0


def commit(broker: KafkaBroker, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit offsets for ``group`` as the sink would (no consumer joins the group)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(broker.client_config({"group.id": group, "enable.auto.commit": False}))
    positions = [TopicPartition(topic, p, o) for p, o in offsets.items()]
    try:
        until_coordinator_ready(lambda: consumer.commit(offsets=positions, asynchronous=False))
    finally:
        consumer.close()


def status(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    return dict((get(cp, "eop", name, namespace) or {}).get("status", {}))


def test_lag_in_status_matches_kafka_consumer_groups(
    control_plane: ControlPlane,
    kube_namespace: str,
    kafka_broker: KafkaBroker,
    kafka_topic_factory: TopicFactory,
    operator: OperatorProcess,
) -> None:
    cp, ns, name = control_plane, kube_namespace, "lagging"
    topic = kafka_topic_factory(4)
    group = f"eop.{ns}.{name}"
    produce(kafka_broker, topic, {0: 10, 1: 25, 2: 5, 3: 7})
    commit(kafka_broker, group, topic, {0: 4, 1: 20, 2: 0, 3: 7})
    kafka_secret(cp, ns, name)
    _apply(cp, ns, pipeline(name, kafka_broker, topic, checkInterval="1s", stallTimeout="1h"))

    progress = wait_for(
        lambda: (p := status(cp, ns, name).get("progress", {})).get("lag") == 16 and p,
        "the lag in status",
        timeout=90,
    )
    described = consumer_groups_describe(kafka_broker, group)
    assert sum(row["lag"] for row in described.values()) == progress["lag"]
    assert status(cp, ns, name)["lag"] == progress["lag"]  # the LAG column
    # The worst three partitions, largest lag first, as the broker's tool reports them.
    worst = sorted(described.items(), key=lambda item: (-item[1]["lag"], item[0]))[:3]
    assert progress["worstPartitions"] == [
        {"topic": t, "partition": p, **row} for (t, p), row in worst
    ]
    assert [p["partition"] for p in progress["worstPartitions"]] == [0, 1, 2]
    assert "message" not in progress  # nothing went wrong reading the offsets
    assert progress["heldPartitions"] == {topic: [0, 1, 2, 3]}  # what G has held

    # Input arrives: the end offsets and the input rate follow; G moves: so does the lag.
    produce(kafka_broker, topic, {3: 50})
    commit(kafka_broker, group, topic, {0: 10, 1: 25, 2: 5})
    progress = wait_for(
        lambda: (p := status(cp, ns, name).get("progress", {})).get("lag") == 50 and p,
        "the lag to follow",
        timeout=60,
    )
    assert progress["worstPartitions"] == [
        {"topic": topic, "partition": 3, "committed": 7, "end": 57, "lag": 50}
    ]
    assert progress["lastCommitTime"]  # G advanced while the operator watched
    wait_for(lambda: status(cp, ns, name)["progress"].get("inputRate"), "an input rate")
    lag_metric = f'eop_pipeline_lag_records{{namespace="{ns}",pipeline="{name}"}}'
    wait_for(lambda: operator.metric(lag_metric) == 50, "the lag metric")

    # G loses a partition it held (deleted here; expiry looks the same): the status names it.
    subprocess.run(
        [
            "java",
            "-cp",
            f"{kafka_broker.libs}/*",
            "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
            "--bootstrap-server",
            kafka_broker.bootstrap_servers,
            "--delete-offsets",
            "--group",
            group,
            "--topic",
            f"{topic}:3",
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    message = wait_for(
        lambda: status(cp, ns, name)["progress"].get("message"), "the lost partition in status"
    )
    assert f"no committed offset for {topic}-3, which it held before" in message


def test_lag_across_clusters_reads_g_on_the_sink_under_its_progress_topics(
    control_plane: ControlPlane,
    kube_namespace: str,
    kafka_broker: KafkaBroker,
    kafka_topic_factory: TopicFactory,
    other_cluster_broker: KafkaBroker,
    operator: OperatorProcess,
) -> None:
    """Source and sink on two clusters: end offsets from one, G from the other's progress topics.

    Decoys on both clusters would show another lag if G were read anywhere else: G's name on
    the source cluster (where only the lag view lives) and the sink cluster's own topic of
    the source topic's name. No driver runs here, so the operator also keeps G alive, and
    copies what it re-committed to the lag view on the source cluster.
    """
    cp, ns, name, other = control_plane, kube_namespace, "across", other_cluster_broker
    topic = kafka_topic_factory(2)
    group = f"eop.{ns}.{name}"
    progress_topic = f"{group}.progress.{topic}"
    produce(kafka_broker, topic, {0: 10, 1: 6})
    other.create_topic(progress_topic, 2)
    commit(other, group, progress_topic, {0: 7, 1: 6})  # the truth: 3 records to go
    other.create_topic(topic, 2)
    commit(other, group, topic, {0: 10, 1: 6})  # decoy: lag 0 under the source names
    commit(kafka_broker, group, topic, {0: 1, 1: 1})  # decoy: a stale lag view, lag 14
    kafka_secret(cp, ns, name)
    manifest = pipeline(name, kafka_broker, topic, checkInterval="1s", stallTimeout="1h")
    manifest["spec"]["sink"]["kafka"]["bootstrapServers"] = other.bootstrap_servers
    _apply(cp, ns, manifest)

    progress = wait_for(
        lambda: (p := status(cp, ns, name).get("progress", {})).get("lag") == 3 and p,
        "the lag in status",
        timeout=90,
    )
    assert progress["worstPartitions"] == [
        {"topic": topic, "partition": 0, "committed": 7, "end": 10, "lag": 3}
    ]
    assert progress["heldPartitions"] == {topic: [0, 1]}
    assert "message" not in progress
    # The operator's refresh while no driver runs: G kept, the lag view on the source follows.
    wait_for(lambda: committed(kafka_broker, group, topic, 2) == {0: 7, 1: 6}, "the lag view")
    assert consumer_groups_describe(kafka_broker, group)[(topic, 0)]["lag"] == 3
    assert committed(other, group, progress_topic, 2) == {0: 7, 1: 6}
    assert committed(other, group, topic, 2) == {0: 10, 1: 6}  # never touched


def test_missing_kafka_secret_is_a_status_message(
    control_plane: ControlPlane,
    kube_namespace: str,
    kafka_broker: KafkaBroker,
    kafka_topic_factory: TopicFactory,
    operator: OperatorProcess,
) -> None:
    cp, ns, name = control_plane, kube_namespace, "nosecret"
    topic = kafka_topic_factory(1)
    # The referenced Secret does not exist: the status says so, nothing crashes.
    _apply(cp, ns, pipeline(name, kafka_broker, topic, checkInterval="1s"))
    message = wait_for(
        lambda: status(cp, ns, name).get("progress", {}).get("message"), "a progress message"
    )
    assert message == f"Secret {name}-kafka does not exist"
    assert operator.alive()


def pod(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    return get(cp, "pod", name, namespace)


def mark_ready(cp: ControlPlane, namespace: str, name: str) -> None:
    """What a kubelet does once the driver container runs and passes its probes."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    patch = {
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            ],
        }
    }
    cp.kubectl(
        "patch",
        "pod",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(patch),
        check=True,
    )


def restart_events(cp: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    return [e for e in _events(cp, namespace, name) if e["reason"] == "RestartStalled"]


@pytest.mark.slow
def test_a_stalled_driver_is_restarted(
    control_plane: ControlPlane,
    kube_namespace: str,
    kafka_broker: KafkaBroker,
    kafka_topic_factory: TopicFactory,
    operator: OperatorProcess,
) -> None:
    cp, ns, name = control_plane, kube_namespace, "stuck"
    topic = kafka_topic_factory(1)
    produce(kafka_broker, topic, {0: 5})  # input waits; nothing ever commits to G
    kafka_secret(cp, ns, name)
    manifest = pipeline(name, kafka_broker, topic, checkInterval="1s", stallTimeout="4s")
    manifest["spec"]["trigger"] = {"processingTime": "1s"}  # a stall timeout must outlast it
    _apply(cp, ns, manifest)
    pod_name = f"{name}-driver-0"
    first = wait_for(lambda: pod(cp, ns, pod_name), "the driver pod")
    wait_for(lambda: status(cp, ns, name).get("lag") == 5, "the lag in status", timeout=60)

    # Not Ready (starting): never restarted, however long G stands still.
    time.sleep(8)
    assert restart_events(cp, ns, name) == []
    assert (pod(cp, ns, pod_name) or {})["metadata"]["uid"] == first["metadata"]["uid"]

    # Ready, input waiting, G not moving for the stall timeout: restarted, with an event.
    mark_ready(cp, ns, pod_name)
    (event,) = wait_for(lambda: restart_events(cp, ns, name), "a RestartStalled event", timeout=60)
    assert event["type"] == "Warning"
    assert "5 records waiting" in event["message"] and pod_name in event["message"]
    wait_for(
        lambda: (p := pod(cp, ns, pod_name)) and p["metadata"]["uid"] != first["metadata"]["uid"],
        "the StatefulSet to recreate the driver pod",
    )
    restarts = f'eop_driver_restarts_total{{namespace="{ns}",pipeline="{name}",reason="Stalled"}}'
    assert operator.metric(restarts) == 1

    # The new pod is not Ready: no second restart.
    time.sleep(6)
    assert len(restart_events(cp, ns, name)) == 1


def committed(broker: KafkaBroker, group: str, topic: str, partitions: int) -> dict[int, int]:
    """``group``'s stable committed offsets of ``topic`` (partitions it has none for are absent)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        broker.client_config({"group.id": group, "isolation.level": "read_committed"})
    )
    try:
        found = consumer.committed(
            [TopicPartition(topic, p) for p in range(partitions)], timeout=30
        )
        return {tp.partition: tp.offset for tp in found if tp.offset >= 0}
    finally:
        consumer.close()


@pytest.mark.slow
def test_a_suspended_pipelines_progress_outlives_the_retention(
    control_plane: ControlPlane,
    kube_namespace: str,
    short_retention_broker: KafkaBroker,
    operator: OperatorProcess,
) -> None:
    """No driver runs, yet the operator keeps G: a pipeline may stay suspended for weeks.

    The same for a pipeline that is not suspended but whose driver pod runs no container
    (a crash loop; here no kubelet ever starts it), and for one whose spec was refused
    (phase Invalid: the G of the spec that last ran waits for the user's fix), in the same
    minute.
    """
    cp, ns, broker = control_plane, kube_namespace, short_retention_broker
    name, topic, other = "resting", "in-resting", "in-unwatched"
    broker.create_topic(topic, 2)
    broker.create_topic(other, 1)
    produce(broker, topic, {0: 5, 1: 3})
    group = f"eop.{ns}.{name}"
    commit(broker, group, topic, {0: 5, 1: 3})
    kafka_secret(cp, ns, name)
    manifest = pipeline(name, broker, topic, checkInterval="5s")
    manifest["spec"]["suspend"] = True
    _apply(cp, ns, manifest)
    stuck, stuck_topic = "crashing", "in-crashing"
    broker.create_topic(stuck_topic, 1)
    produce(broker, stuck_topic, {0: 4})
    commit(broker, f"eop.{ns}.{stuck}", stuck_topic, {0: 4})
    kafka_secret(cp, ns, stuck)
    _apply(cp, ns, pipeline(stuck, broker, stuck_topic, checkInterval="5s"))
    refused, refused_topic = "refused", "in-refused"
    broker.create_topic(refused_topic, 1)
    produce(broker, refused_topic, {0: 6})
    commit(broker, f"eop.{ns}.{refused}", refused_topic, {0: 6})
    kafka_secret(cp, ns, refused)
    ran = pipeline(refused, broker, refused_topic, checkInterval="5s")
    _apply(cp, ns, ran)
    wait_for(lambda: status(cp, ns, refused).get("transactionalIdPrefix"), "its identity recorded")
    # What the operator records once a spec ran healthily (no kubelet runs a driver here).
    stable = json.dumps({"status": {"lastStableSpec": ran["spec"]}})
    cp.kubectl(
        "patch",
        "eop",
        refused,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        stable,
        check=True,
    )
    ran["spec"]["transactions"] = {"idPrefix": "another-identity"}  # refused: ids cannot change
    _apply(cp, ns, ran)
    wait_for(lambda: status(cp, ns, refused).get("phase") == "Invalid", "the new spec refused")
    commit(broker, "eop.unwatched", other, {0: 0})  # no pipeline: expires as Kafka says
    wait_for(lambda: pod(cp, ns, f"{stuck}-driver-0"), "the crashing pipeline's driver pod")

    # The group no pipeline keeps was committed last: once the broker has expired it
    # (retention, then its next check), every group of that minute would have gone too.
    wait_for(
        lambda: committed(broker, "eop.unwatched", other, 1) == {},
        "the broker to expire the group no pipeline keeps",
        timeout=SHORT_RETENTION_S + 60,
    )
    assert committed(broker, group, topic, 2) == {0: 5, 1: 3}
    assert committed(broker, f"eop.{ns}.{stuck}", stuck_topic, 1) == {0: 4}
    assert pod(cp, ns, f"{stuck}-driver-0") is not None  # its pod was there all along
    assert committed(broker, f"eop.{ns}.{refused}", refused_topic, 1) == {0: 6}
    assert status(cp, ns, refused).get("phase") == "Invalid"  # refused all along
