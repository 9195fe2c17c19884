"""pytest plugin: a real Kafka broker (KRaft, single node, transactions on) from devenv/kafka.py.

Fixtures:

* ``kafka_broker`` (session): fetches the jars if needed (``devenv/fetch-jars.sh kafka``, a
  no-op when cached), starts a :class:`devenv.kafka.KafkaBroker` in a temp dir and returns once
  a transactional producer can commit on it; stopped at the end of the session. Use its
  ``bootstrap_servers`` or ``client_config()``; ``sasl_bootstrap_servers`` and
  ``sasl_plain_users`` for a listener that needs SASL/PLAIN credentials;
  ``tls_bootstrap_servers`` (TLS) and ``mtls_bootstrap_servers`` (TLS with client
  certificates) for listeners whose certificates ``kafka_tls_certs`` holds;
  ``cluster_bootstrap_servers`` (``10.88.0.1:PORT``) for pods of the multi-node local cluster,
  once the test has exposed ``cluster_port`` (``LocalCluster.expose_host_port``).
* ``kafka_tls_certs`` (session): the CA and the broker's and clients' PEM files
  (:func:`devenv.certs.make_certs`) of the session broker's TLS listeners.
* ``kafka_topic_factory`` (function): ``make(partitions=1, *, prefix=None, config=None) -> name``
  creates a uniquely named topic (topics are never auto-created on this broker).
* ``kafka_topic`` (function): one fresh single-partition topic's name.
* ``short_retention_broker`` (session, stopped after its last user): another broker that
  expires a member-less group's committed offsets ``SHORT_RETENTION_S`` (a minute, the least
  Kafka accepts) after their last commit, checking every 2 s.
* ``short_retention_cluster`` (session, stopped after its last user): a replicated cluster
  (3 nodes, as ``kafka_cluster``) whose every node expires offsets as
  ``short_retention_broker`` does (:data:`SHORT_RETENTION`).
* ``kafka_cluster`` (session): a replicated cluster as production runs it
  (:class:`devenv.kafka_cluster.KafkaCluster`): 3 nodes, each broker and KRaft controller,
  replication factor 3 and ``min.insync.replicas`` 2 for every topic, internal ones included.
  Its ``offsets.retention.minutes`` differ by node (:data:`CLUSTER_RETENTION_MINUTES`).
* ``kafka_cluster_chaos`` (function): ``kafka_cluster`` for a test that kills, stops or rolls
  its nodes: afterwards every node runs again and every partition is fully replicated.
* ``field_cluster`` (session, stopped after its last user) and ``field_cluster_chaos``
  (function): the same replicated cluster, every node of ``FIELD_KAFKA_VERSION`` (Kafka 3.x).
* ``other_cluster_broker`` (module): a second Kafka cluster (its own cluster id) for pipelines
  whose source and sink are different clusters. Its PLAINTEXT clients are super users; its
  SASL/PLAIN listener admits one user (``sasl_plain_users``) whom ACLs can limit (the
  ``StandardAuthorizer``, everything allowed where no ACL says otherwise).
* ``field_broker`` (session, stopped after its last user): a broker of the older Kafka release
  users run, ``KAFKA_FIELD_VERSION`` of devenv/versions.env (:data:`FIELD_KAFKA_VERSION`, 3.x:
  transaction protocol v1), set up as ``kafka_broker`` but with a PLAINTEXT listener only. A
  test (or one parameter of it) marked ``field_broker`` gets it too, and ``make_pipeline`` puts
  its pipelines there (tests/spark_apps/conftest.py).

Nothing is fetched or started unless a test requests one of them. Tests using them should be
marked ``@pytest.mark.kafka`` (tests that request ``kafka_broker``, ``kafka_cluster`` or
``field_broker`` get the mark automatically, so ``-m "not kafka"`` deselects them).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Protocol

import pytest

from devenv.certs import Certs, make_certs
from devenv.kafka import CONSUMER_GROUPS_TOOL, KafkaBroker, KafkaClients
from devenv.kafka_cluster import KafkaCluster
from devenv.podnet import GATEWAY
from devenv.versions import versions
from tests.plugins.lifetimes import BROKERS


class TopicFactory(Protocol):
    """The type of the ``kafka_topic_factory`` fixture."""

    def __call__(
        self,
        partitions: int = 1,
        *,
        prefix: str | None = None,
        config: Mapping[str, str] | None = None,
    ) -> str:
        """Create a uniquely named topic on the session broker and return its name."""
        ...


#: ``short_retention_broker``'s ``offsets.retention.minutes``, in seconds.
SHORT_RETENTION_S = 60
#: The broker settings of that retention, checked for every 2 s.
SHORT_RETENTION = {
    "offsets.retention.minutes": str(SHORT_RETENTION_S // 60),
    "offsets.retention.check.interval.ms": "2000",
}
#: ``kafka_cluster``'s ``offsets.retention.minutes`` by node: not Kafka's default (7 days),
#: and one node's smaller than the others' (the one a keep-alive must go by).
CLUSTER_RETENTION_MINUTES = {1: 2880, 2: 1440, 3: 2880}
#: The Kafka release of the session's broker and of ``kafka_cluster``.
KAFKA_VERSION = versions()["KAFKA_VERSION"]
#: The Kafka release of ``field_broker`` and ``field_cluster``.
FIELD_KAFKA_VERSION = versions()["KAFKA_FIELD_VERSION"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a broker ``kafka``."""
    for item in items:
        if BROKERS & set(getattr(item, "fixturenames", ())) or item.get_closest_marker(
            "field_broker"
        ):
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(scope="session")
def kafka_tls_certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """The session broker's TLS material: a CA, its broker and client certificates, and more.

    ``user`` (valid), ``expired`` (signed by the CA, expired) and ``other`` (signed by
    ``other-ca``): see :mod:`devenv.certs`. Made with openssl in about a second.
    """
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def kafka_broker(
    tmp_path_factory: pytest.TempPathFactory, kafka_tls_certs: Certs
) -> Iterator[KafkaBroker]:
    """A running broker shared by the whole session (its log: ``kafka_broker.log_path``).

    Besides PLAINTEXT it listens with SASL/PLAIN (``sasl_bootstrap_servers``) for one
    user with a random password (``sasl_plain_users``), and with TLS
    (``tls_bootstrap_servers``) and mutual TLS (``mtls_bootstrap_servers``) with
    ``kafka_tls_certs``' certificates, and one for pods of the multi-node local cluster
    (``cluster_bootstrap_servers``, advertised at its gateway): more listeners cost the broker
    nothing noticeable, a second broker would cost a JVM.
    """
    users = {"eop-test": uuid.uuid4().hex}
    with KafkaBroker(
        tmp_path_factory.mktemp("kafka"),
        sasl_plain_users=users,
        tls_certs=kafka_tls_certs.directory,
        cluster_address=GATEWAY,
    ) as broker:
        yield broker


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A running 3-node replicated cluster shared by the session (logs: ``node-<id>/broker.log``).

    Its nodes start in parallel (~15 s on 2 cores). Tests that kill, stop or roll nodes take
    ``kafka_cluster_chaos`` instead, which leaves the cluster whole for the next test.
    """
    node_overrides = {
        node: {"offsets.retention.minutes": str(minutes)}
        for node, minutes in CLUSTER_RETENTION_MINUTES.items()
    }
    with KafkaCluster(
        tmp_path_factory.mktemp("kafka-cluster"), node_overrides=node_overrides
    ) as cluster:
        yield cluster


def _whole_again(cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    """``cluster`` for one test; afterwards every node runs and every ISR is full."""
    yield cluster
    cluster.start()
    cluster.wait_fully_replicated()


@pytest.fixture
def kafka_cluster_chaos(kafka_cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    """``kafka_cluster``, whole again after the test: every node runs, every ISR is full."""
    yield from _whole_again(kafka_cluster)


@pytest.fixture(scope="session")
def field_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A 3-node replicated cluster as ``kafka_cluster``, every node of Kafka 3.x."""
    with KafkaCluster(
        tmp_path_factory.mktemp("field-cluster"), version=FIELD_KAFKA_VERSION
    ) as cluster:
        yield cluster


@pytest.fixture
def field_cluster_chaos(field_cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    """``field_cluster``, whole again after the test (as ``kafka_cluster_chaos``)."""
    yield from _whole_again(field_cluster)


@pytest.fixture
def kafka_topic_factory(kafka_broker: KafkaBroker, request: pytest.FixtureRequest) -> TopicFactory:
    """Create uniquely named topics: ``kafka_topic_factory(3)`` -> ``"test-name-1a2b3c4d"``."""
    # A test that stopped or killed the shared broker leaves it restartable: same port, same data.
    kafka_broker.start()
    default_prefix = re.sub(r"[^a-zA-Z0-9._-]+", "-", request.node.name).strip("-")[:100]

    def make(
        partitions: int = 1,
        *,
        prefix: str | None = None,
        config: Mapping[str, str] | None = None,
    ) -> str:
        name = f"{prefix or default_prefix or 'topic'}-{uuid.uuid4().hex[:8]}"
        kafka_broker.create_topic(name, partitions, config=config)
        return name

    return make


@pytest.fixture
def kafka_topic(kafka_topic_factory: TopicFactory) -> str:
    """The name of a fresh single-partition topic."""
    return kafka_topic_factory(1)


@pytest.fixture(scope="session")
def short_retention_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A broker that expires a member-less group's offsets a minute after their last commit."""
    with KafkaBroker(tmp_path_factory.mktemp("retention"), overrides=SHORT_RETENTION) as broker:
        yield broker


@pytest.fixture(scope="session")
def short_retention_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A 3-node replicated cluster whose nodes expire offsets as ``short_retention_broker``."""
    with KafkaCluster(
        tmp_path_factory.mktemp("retention-cluster"), overrides=SHORT_RETENTION
    ) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def field_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A broker of :data:`FIELD_KAFKA_VERSION` (Kafka 3.x), shared by its users in the session."""
    with KafkaBroker(tmp_path_factory.mktemp("kafka-field"), version=FIELD_KAFKA_VERSION) as broker:
        yield broker


def inter_broker_protocol(cluster: KafkaClients) -> str | None:
    """The ``inter.broker.protocol.version`` a broker of ``cluster`` reports over the admin API.

    A Kafka 3.x broker reports its release's protocol (``3.9-IV0`` for 3.9.x); Kafka 4 removed
    the setting, so a 4.x broker reports none (``None``).
    """
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient(cluster.client_config({"log_level": 3}))
    broker = min(admin.list_topics(timeout=30).brokers)
    resource = ConfigResource(ResourceType.BROKER, str(broker))
    entry = (
        admin.describe_configs([resource])[resource].result(30).get("inter.broker.protocol.version")
    )
    return None if entry is None else str(entry.value)


def assert_runs_release(cluster: KafkaClients, version: str) -> None:
    """``cluster``, asked over the admin API, runs Kafka ``version``: a 3.x broker reports its
    release's inter-broker protocol (``3.9-IV0``), a 4.x one none."""
    reported = inter_broker_protocol(cluster)
    if int(version.split(".", 1)[0]) >= 4:
        assert reported is None, f"a Kafka 3.x broker ({reported}), not Kafka {version}"
        return
    release = version.rsplit(".", 1)[0]  # 3.9.1 -> 3.9
    assert reported is not None, f"not a Kafka {version} broker: a 4.x one"
    assert reported.split("-")[0] == release, f"Kafka {reported}, not {version}"


@pytest.fixture(scope="module")
def other_cluster_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A second Kafka cluster, with ACLs that can limit its SASL user (see the module doc)."""
    overrides = {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",  # PLAINTEXT clients, the broker and its controller
        "allow.everyone.if.no.acl.found": "true",
    }
    users = {"eop-limited": uuid.uuid4().hex}
    with KafkaBroker(
        tmp_path_factory.mktemp("other-cluster"), overrides=overrides, sasl_plain_users=users
    ) as broker:
        yield broker


def consumer_groups_describe(
    broker: KafkaBroker, group: str
) -> dict[tuple[str, int], dict[str, int]]:
    """``kafka-consumer-groups --describe --group`` (the broker's own tool), by partition."""
    result = broker.run_tool(
        CONSUMER_GROUPS_TOOL,
        *("--bootstrap-server", broker.bootstrap_servers, "--describe", "--group", group),
        check=True,
    )
    lines = [line.split() for line in result.stdout.splitlines() if line.strip()]
    header = next(i for i, cols in enumerate(lines) if "CURRENT-OFFSET" in cols)
    names = lines[header]
    rows = {}
    for cols in lines[header + 1 :]:
        row = dict(zip(names, cols, strict=False))
        rows[(row["TOPIC"], int(row["PARTITION"]))] = {
            "committed": int(row["CURRENT-OFFSET"]),
            "end": int(row["LOG-END-OFFSET"]),
            "lag": int(row["LAG"]),
        }
    return rows


def read_values(
    cluster: KafkaClients, topic: str, isolation: str, until: bytes, timeout: float = 30.0
) -> list[bytes]:
    """Read ``topic`` from the start with ``isolation`` until the value ``until`` shows up."""
    from confluent_kafka import Consumer, KafkaError

    consumer = Consumer(
        cluster.client_config(
            {
                "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                "isolation.level": isolation,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "log_level": 3,
            }
        )
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while until not in values:
            assert time.monotonic() < deadline, f"{until!r} not read in {timeout}s: {values}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                continue
            value = msg.value()
            assert value is not None
            values.append(value)
    finally:
        consumer.close()
    return values
