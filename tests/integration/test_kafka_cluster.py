"""The dev replicated cluster (devenv/kafka_cluster.py) really does what broker-failure tests need.

A transactional producer that also commits a group's offsets (as eop's sinks commit the
progress group) keeps committing while a node is killed and restarted, and through a rolling
restart, and a read_committed reader sees each committed record once and nothing else. After a
roll every partition is fully replicated again. The coordinator and controller lookups name the
node that really holds the role: Kafka's own tools agree, and when that node goes a live one is
named.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from devenv.kafka import TRANSACTIONS_TOOL, KafkaBrokerError, until_coordinator_ready
from devenv.kafka_cluster import KafkaCluster
from tests.plugins.kafka import read_values

pytestmark = pytest.mark.kafka

TIMEOUT = 30.0


class _Stuck(Exception):
    """A producer call that did not return within its timeout."""


class CommitLoop:
    """A thread committing one record and the group's offset per transaction, until stopped."""

    def __init__(self, cluster: KafkaCluster, topic: str) -> None:
        self.topic = topic
        self.group = f"g-{uuid.uuid4().hex[:8]}"
        self.transactional_id = f"t-{uuid.uuid4().hex[:8]}"
        self.cluster = cluster
        #: The values of the committed transactions, in order.
        self.committed: list[bytes] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commit-loop", daemon=True)

    def __enter__(self) -> CommitLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)

    def _run(self) -> None:
        try:
            self._commit_until_stopped()
        except BaseException as exc:
            self.error = exc

    def _producer(self) -> Producer:
        """A producer of the loop's transactional id, fencing any older one."""
        config = {"transactional.id": self.transactional_id, "log_level": 0}
        producer = Producer(self.cluster.client_config(config))
        until_coordinator_ready(lambda: producer.init_transactions(TIMEOUT))
        return producer

    def _commit_until_stopped(self) -> None:
        producer = self._producer()
        # The group is only named, never joined: as eop's progress group.
        member = Consumer(self.cluster.client_config({"group.id": self.group, "log_level": 0}))
        metadata = member.consumer_group_metadata()
        n = 0
        while not self._stop.is_set():
            value = f"v{n}".encode()
            n += 1
            producer.begin_transaction()
            try:
                producer.produce(self.topic, value)
                self._send_offsets(producer, metadata)
                until_coordinator_ready(partial(producer.commit_transaction, TIMEOUT))
                self.committed.append(value)
            except _Stuck:
                producer = self._producer()  # it fences the stuck one: its transaction aborts
            except KafkaException as exc:
                if not exc.args[0].txn_requires_abort():
                    raise
                until_coordinator_ready(partial(producer.abort_transaction, TIMEOUT))
        producer.flush(TIMEOUT)
        member.close()

    def _send_offsets(self, producer: Producer, metadata: Any) -> None:
        """Add the group's offset to the transaction, as eop's sinks do: bounded, as librdkafka
        2.16 can block in this call past its timeout when the group's coordinator went away
        (confluentinc/librdkafka#5456, #5511; the runner bounds it the same way)."""
        offsets = [TopicPartition(self.topic, 0, len(self.committed) + 1)]
        outcome: list[BaseException | None] = []

        def send() -> None:
            try:
                until_coordinator_ready(
                    lambda: producer.send_offsets_to_transaction(offsets, metadata, TIMEOUT)
                )
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        call = threading.Thread(target=send, name="send-offsets", daemon=True)
        call.start()
        call.join(TIMEOUT + 5)
        if not outcome:
            raise _Stuck("send_offsets_to_transaction")
        if outcome[0] is not None:
            raise outcome[0]

    def await_commits(self, more: int, timeout: float = 90.0) -> None:
        """Wait until ``more`` transactions more than now have committed."""
        target = len(self.committed) + more
        deadline = time.monotonic() + timeout
        while len(self.committed) < target:
            assert self.error is None, f"the producer failed: {self.error!r}"
            assert time.monotonic() < deadline, f"fewer than {more} commits in {timeout}s"
            time.sleep(0.05)

    def assert_exactly_once(self) -> None:
        """A read_committed reader sees every committed record once, nothing else."""
        assert self.error is None, f"the producer failed: {self.error!r}"
        last = self.committed[-1]
        assert read_values(self.cluster, self.topic, "read_committed", last) == self.committed


@pytest.fixture
def topic(kafka_cluster: KafkaCluster) -> Iterator[str]:
    name = f"cluster-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(name, 1)
    yield name


@pytest.mark.slow
def test_every_partition_is_replicated_three_times(kafka_cluster: KafkaCluster, topic: str) -> None:
    topics = AdminClient(kafka_cluster.client_config()).list_topics(timeout=TIMEOUT).topics
    assert {len(p.replicas) for p in topics[topic].partitions.values()} == {3}
    assert {len(p.replicas) for p in topics["__transaction_state"].partitions.values()} == {3}
    # A follower of a new partition joins its ISR once it has fetched: on a busy machine that
    # takes a moment after the topic's creation, so wait for it (raises when it never comes).
    kafka_cluster.wait_fully_replicated(TIMEOUT)
    assert kafka_cluster.under_replicated() == []


@pytest.mark.slow
def test_transactions_keep_committing_while_their_coordinator_is_killed(
    kafka_cluster_chaos: KafkaCluster, topic: str
) -> None:
    cluster = kafka_cluster_chaos
    with CommitLoop(cluster, topic) as loop:
        loop.await_commits(3)
        victim = cluster.transaction_coordinator(loop.transactional_id)
        described = cluster.nodes[0].run_tool(
            TRANSACTIONS_TOOL,
            *("--bootstrap-server", cluster.bootstrap_servers, "describe"),
            *("--transactional-id", loop.transactional_id),
            check=True,
        )
        header, row = (line.split() for line in described.stdout.splitlines()[:2])
        assert row[header.index("CoordinatorId")] == str(victim)

        assert victim is not None
        cluster.kill(victim)
        loop.await_commits(3)  # the coordinator moved to a live node
        assert cluster.transaction_coordinator(loop.transactional_id) in cluster.running
        cluster.start(victim)
        loop.await_commits(3)
    loop.assert_exactly_once()


@pytest.mark.slow
def test_a_roll_keeps_transactions_going_and_ends_fully_replicated(
    kafka_cluster_chaos: KafkaCluster, topic: str
) -> None:
    cluster = kafka_cluster_chaos
    with CommitLoop(cluster, topic) as loop:
        loop.await_commits(3)
        before = len(loop.committed)
        cluster.roll()
        assert cluster.running == [1, 2, 3]
        assert cluster.under_replicated() == []
        loop.await_commits(3)
    assert len(loop.committed) > before + 3
    loop.assert_exactly_once()


@pytest.mark.slow
def test_a_killed_group_coordinator_hands_the_group_to_a_live_node(
    kafka_cluster_chaos: KafkaCluster, topic: str
) -> None:
    cluster = kafka_cluster_chaos
    with CommitLoop(cluster, topic) as loop:
        loop.await_commits(3)
    admin = AdminClient(cluster.client_config({"log_level": 0}))

    def coordinator_says() -> Any:
        return admin.describe_consumer_groups([loop.group])[loop.group].result(TIMEOUT)

    victim = cluster.group_coordinator(loop.group)
    assert victim is not None and until_coordinator_ready(coordinator_says).coordinator.id == victim
    cluster.kill(victim)
    deadline = time.monotonic() + 60
    while cluster.group_coordinator(loop.group) in (victim, None):
        assert time.monotonic() < deadline, "the group never moved"
        time.sleep(0.2)
    named = cluster.group_coordinator(loop.group)
    assert named in cluster.running
    assert until_coordinator_ready(coordinator_says).coordinator.id == named
    # The committed progress moved with it. Stable offsets, as the runner reads its progress:
    # the last transaction's offsets count once its marker is in the group's partition, which
    # the transaction coordinator writes after the commit returned (maybe to the new leader).
    (listed,) = until_coordinator_ready(
        lambda: admin.list_consumer_group_offsets(
            [_group_request(loop.group, topic)], require_stable=True, request_timeout=TIMEOUT
        )[loop.group].result(TIMEOUT)
    ).topic_partitions
    assert listed.offset == len(loop.committed)


def _group_request(group: str, topic: str) -> Any:
    from confluent_kafka import ConsumerGroupTopicPartitions

    return ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])


def test_the_active_controller_is_named_and_a_new_one_takes_over(
    kafka_cluster_chaos: KafkaCluster,
) -> None:
    cluster = kafka_cluster_chaos
    controller = cluster.active_controller()
    log = cluster.node(controller).log_path.read_text(errors="replace")
    assert re.search(r"Becoming the active controller|becoming the active controller", log), (
        "the node named is not one that became the active controller"
    )
    cluster.stop(controller)
    deadline = time.monotonic() + 60
    successor = controller
    while successor == controller:
        assert time.monotonic() < deadline, "no new active controller"
        with contextlib.suppress(KafkaBrokerError):  # no leader while the quorum votes
            successor = cluster.active_controller()
    assert successor in cluster.running
    cluster.create_topic(f"after-{uuid.uuid4().hex[:8]}")  # the controller answers


@pytest.mark.slow
def test_the_whole_cluster_stops_without_waiting_out_its_timeout_and_keeps_its_data(
    kafka_cluster_chaos: KafkaCluster, topic: str
) -> None:
    """Stopping the cluster (``kafka up --brokers 3`` ended, a session's teardown) does not wait
    out its timeout on a node that has no quorum left to record its controlled shutdown;
    started again, the cluster serves what was committed before."""
    cluster = kafka_cluster_chaos
    with CommitLoop(cluster, topic) as loop:
        loop.await_commits(3)
    # Two nodes down already: the one left has lost its quorum (as the last of a whole
    # cluster stopped at once may have, by the time its own shutdown needs the quorum).
    for node in cluster.running[:2]:
        cluster.stop(node)
    timeout = 120.0
    began = time.monotonic()
    cluster.stop(timeout=timeout)
    took = time.monotonic() - began
    assert cluster.running == []
    assert took < timeout / 2, f"stopping the cluster took {took:.0f}s of its {timeout:.0f}s"
    cluster.start()
    loop.assert_exactly_once()
