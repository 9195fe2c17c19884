"""A replicated Kafka cluster (KRaft) on 127.0.0.1, as production runs it, for tests and humans.

``brokers`` nodes (3 by default), each broker and controller of one static quorum
(``controller.quorum.voters``), formatted with one cluster id. Every partition, the internal
topics' included, has 3 replicas (fewer only with fewer nodes) and ``min.insync.replicas`` 2:
one node may be down without stopping a write, transactions or a group's commits. Each node
is a :class:`devenv.kafka.KafkaBroker` (same ports after a restart, same data, same log), so
a node can be killed, stopped, restarted and rolled as operators of Kafka do::

    with KafkaCluster(work_dir) as cluster:
        cluster.create_topic("events", partitions=3)
        cluster.kill(cluster.leader_of("events", 0))
        ...
        cluster.roll()

Nodes are named by their Kafka ``node.id``: 1 to ``brokers``.

For a shell: ``python -m devenv.kafka up --dir /tmp/kafka --brokers 3``.
"""

from __future__ import annotations

import concurrent.futures
import re
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Self

from devenv.kafka import (
    KafkaBroker,
    KafkaBrokerError,
    KafkaClients,
    random_cluster_id,
    replication_properties,
)
from devenv.processes import Service, distinct_free_ports

#: Main class of ``kafka-metadata-quorum``, which names the active controller.
METADATA_QUORUM_TOOL = "org.apache.kafka.tools.MetadataQuorumCommand"
#: The replicas of every partition (fewer only when the cluster has fewer nodes).
REPLICAS = 3
#: Seconds a node still stopping gets once a majority of the voters has exited.
QUORUM_LOST_GRACE = 5.0


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()`` of ``text`` (over UTF-16 code units), as a signed int."""
    h = 0
    encoded = text.encode("utf-16-be")
    for i in range(0, len(encoded), 2):
        h = (31 * h + int.from_bytes(encoded[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """The partition of ``__consumer_offsets`` or ``__transaction_state`` that holds ``key``.

    Kafka's rule for a group id or a transactional id: ``Utils.abs(key.hashCode()) % n``,
    where ``Utils.abs`` maps ``Integer.MIN_VALUE`` to 0.
    """
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class KafkaClusterNode(KafkaBroker):
    """One node of a :class:`KafkaCluster`: a broker and a voter of the cluster's quorum."""

    def __init__(self, cluster: KafkaCluster, node_id: int, **kwargs: Any) -> None:
        """A node in ``cluster.work_dir / node-<node_id>``; ``kwargs`` as :class:`KafkaBroker`."""
        super().__init__(cluster.work_dir / f"node-{node_id}", **kwargs)
        self.cluster = cluster
        self.node_id = node_id

    @property
    def controller_port(self) -> int:
        """The CONTROLLER listener's port (the quorum's voters name it)."""
        if self._controller_port is None:
            raise KafkaBrokerError(f"node {self.node_id} has no ports yet")
        return self._controller_port

    def _quorum_properties(self) -> dict[str, str]:
        return {"node.id": str(self.node_id), "controller.quorum.voters": self.cluster.voters}

    def _format_args(self) -> list[str]:
        return [f"--cluster-id={self.cluster.cluster_id}"]

    def _fence_stale_registration(self, props: Path, deadline: float) -> None:
        """After a crash, wait until the other nodes have fenced this node's old incarnation.

        The quorum lives on without this node: its controller fences the crashed broker once
        its session times out (``broker.session.timeout.ms``), and the node then comes back
        as a new incarnation (see :meth:`KafkaBroker._fence_stale_registration` for what a
        restart before that costs).
        """
        others = [n for n in self.cluster.nodes if n is not self and n.running]
        if not others:
            return
        while time.monotonic() < deadline:
            try:
                if self.node_id not in self.cluster.live_brokers(others):
                    return
            except KafkaBrokerError:
                pass  # the others are starting too: ask again
            time.sleep(0.3)
        raise KafkaBrokerError(f"node {self.node_id}'s crashed incarnation was never fenced")

    def _wait_ready(self, deadline: float) -> None:
        """Transactions work, and this node is a live broker of the cluster again."""
        super()._wait_ready(deadline)
        while self.node_id not in self.cluster.live_brokers([self]):
            if time.monotonic() > deadline:
                raise KafkaBrokerError(f"node {self.node_id} never registered with the quorum")
            time.sleep(0.2)


class KafkaCluster(KafkaClients, Service):
    """``brokers`` Kafka nodes in ``work_dir/node-<id>``, on free 127.0.0.1 ports.

    The ports are picked at the first :meth:`start` and kept (each node's ``ports`` file), so
    a stopped cluster or node comes back with the same ``bootstrap_servers`` and data.
    """

    def __init__(
        self,
        work_dir: Path | str,
        *,
        brokers: int = 3,
        heap: str = "512m",
        overrides: Mapping[str, str] | None = None,
        node_overrides: Mapping[int, Mapping[str, str]] | None = None,
        start_timeout: float = 120.0,
        version: str | None = None,
    ) -> None:
        """Describe a cluster; nothing runs until :meth:`start`.

        ``overrides``: ``server.properties`` entries for every node; ``node_overrides``: by
        node id, entries for that node only (applied last); ``version``: the Kafka release
        every node runs (as :class:`KafkaBroker`'s).
        """
        if brokers < 1:
            raise ValueError("a cluster needs at least one node")
        self.work_dir = Path(work_dir).resolve()
        self.cluster_id = random_cluster_id()  # used when a node is formatted, the first time
        common = {**replication_properties(min(REPLICAS, brokers)), **(overrides or {})}
        node_overrides = node_overrides or {}
        self.nodes = [
            KafkaClusterNode(
                self,
                node_id,
                heap=heap,
                overrides={**common, **node_overrides.get(node_id, {})},
                start_timeout=start_timeout,
                version=version,
            )
            for node_id in range(1, brokers + 1)
        ]

    # -- properties ---------------------------------------------------------------------------

    def node(self, node_id: int) -> KafkaClusterNode:
        """The node with Kafka ``node.id`` ``node_id`` (1 to ``brokers``)."""
        if not 1 <= node_id <= len(self.nodes):
            raise KafkaBrokerError(f"no node {node_id}: the nodes are 1 to {len(self.nodes)}")
        return self.nodes[node_id - 1]

    @property
    def voters(self) -> str:
        """``controller.quorum.voters``: ``1@127.0.0.1:PORT,2@...``."""
        return ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)

    @property
    def bootstrap_servers(self) -> str:
        """Every node's PLAINTEXT listener, comma-separated (clients find the live ones)."""
        return ",".join(n.bootstrap_servers for n in self.nodes)

    def client_config(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A confluent_kafka config dict for the cluster (``bootstrap.servers``) + ``overrides``."""
        return {"bootstrap.servers": self.bootstrap_servers, **(overrides or {})}

    def metadata_views(self) -> list[dict[str, Any]]:
        """One client config per running node: each answers metadata from its own copy."""
        return [{"bootstrap.servers": n.bootstrap_servers} for n in self.nodes if n.running]

    @property
    def running(self) -> list[int]:
        """The ids of the nodes whose JVM is alive."""
        return [n.node_id for n in self.nodes if n.running]

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, node_id: int | None = None) -> Self:
        """Start node ``node_id``, or every node that is not running (in parallel).

        Returns once they work: a node after a kill once the others have fenced its crash.
        The first start picks the ports and formats each node with the cluster id.
        """
        if node_id is not None:
            self.node(node_id).start()
            return self
        stopped = [n for n in self.nodes if not n.running]
        if not stopped:
            return self
        if all(n._port is None for n in self.nodes):
            if (self.nodes[0].data_dir / "meta.properties").exists():
                for n in self.nodes:
                    n._load_ports()  # an existing cluster dir: same ports, same data
            else:
                ports = distinct_free_ports(2 * len(self.nodes))
                for i, n in enumerate(self.nodes):
                    n._assign_ports(ports[2 * i : 2 * i + 2])
        # Format and fence in threads (short JVMs), launch from this thread (the brokers die
        # with it), then wait for all: a node is ready only once a quorum is.
        with concurrent.futures.ThreadPoolExecutor(len(stopped)) as pool:
            props = list(pool.map(lambda n: n._prepare(), stopped))
            for n, p in zip(stopped, props, strict=True):
                n._launch(p)
            for future in [pool.submit(n._await_ready) for n in stopped]:
                future.result()
        return self

    def stop(self, node_id: int | None = None, timeout: float = 60.0) -> None:
        """SIGTERM node ``node_id`` (a controlled shutdown) and wait until it has exited; or
        every node, all at once.

        Once a majority of the voters has exited, no quorum is left to record the others'
        controlled shutdown, and they would wait out ``timeout``: they get
        :data:`QUORUM_LOST_GRACE` seconds more, then SIGKILL (their data stays, marked unclean).
        """
        if node_id is not None:
            self.node(node_id).stop(timeout)
            return
        stopping = [n for n in self.nodes if n.running]
        for n in stopping:
            n.terminate()
        deadline, quorum_lost = time.monotonic() + timeout, False
        while alive := [n for n in stopping if n.running]:
            if not quorum_lost and len(self.nodes) - len(alive) > len(self.nodes) // 2:
                quorum_lost = True
                deadline = min(deadline, time.monotonic() + QUORUM_LOST_GRACE)
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for n in stopping:
            if n.running:
                n.kill()
            else:
                n.stop()

    def kill(self, node_id: int) -> None:
        """SIGKILL node ``node_id`` (a crash); :meth:`start` brings it back."""
        self.node(node_id).kill()

    def restart(self, node_id: int) -> None:
        """Stop node ``node_id`` (SIGTERM), start it again, wait until it is a live broker."""
        self.stop(node_id)
        self.start(node_id)

    def roll(self, timeout: float = 120.0) -> None:
        """A rolling restart, as Strimzi does one: each node in turn, the active controller last.

        Before each node, and at the end, every partition is back in full ISR.
        """
        controller = self.active_controller()
        order = [n.node_id for n in self.nodes if n.node_id != controller] + [controller]
        for node_id in order:
            self.wait_fully_replicated(timeout)
            self.restart(node_id)
        self.wait_fully_replicated(timeout)

    # -- what the cluster says ----------------------------------------------------------------

    def _admin(self, nodes: Iterable[KafkaBroker] | None = None) -> Any:
        from confluent_kafka.admin import AdminClient

        servers = ",".join(n.bootstrap_servers for n in (nodes or self.nodes))
        return AdminClient({"bootstrap.servers": servers, "log_level": 0})

    def _metadata(
        self, nodes: Iterable[KafkaBroker] | None = None, topic: str | None = None
    ) -> Any:
        from confluent_kafka import KafkaException

        try:
            return self._admin(nodes).list_topics(topic, timeout=10)
        except KafkaException as exc:
            raise KafkaBrokerError(f"cannot read the cluster's metadata: {exc}") from exc

    def live_brokers(self, nodes: Iterable[KafkaBroker] | None = None) -> set[int]:
        """The node ids the cluster's metadata (as ``nodes`` tell it) lists: unfenced brokers."""
        return set(self._metadata(nodes).brokers)

    def under_replicated(self) -> list[tuple[str, int]]:
        """Partitions (internal ones too) without a leader or with a replica out of the ISR."""
        topics = self._metadata().topics
        return sorted(
            (name, p.id)
            for name, topic in topics.items()
            for p in topic.partitions.values()
            if p.leader < 0 or set(p.isrs) != set(p.replicas)
        )

    def wait_fully_replicated(self, timeout: float = 120.0) -> None:
        """Wait until every partition has a leader and all its replicas in the ISR."""
        deadline = time.monotonic() + timeout
        while lagging := self.under_replicated():
            if time.monotonic() > deadline:
                raise KafkaBrokerError(f"not fully replicated after {timeout}s: {lagging[:10]}")
            time.sleep(0.2)

    def leader_of(self, topic: str, partition: int) -> int | None:
        """The node id that leads ``topic``'s ``partition`` (None: no leader right now)."""
        meta = self._metadata(topic=topic).topics.get(topic)
        if meta is None or meta.error is not None or partition not in meta.partitions:
            raise KafkaBrokerError(f"no partition {topic}-{partition}")
        leader: int = meta.partitions[partition].leader
        return leader if leader >= 0 else None

    def _coordinator(self, internal_topic: str, key: str) -> int | None:
        meta = self._metadata(topic=internal_topic).topics.get(internal_topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise KafkaBrokerError(f"{internal_topic} does not exist yet (no {key!r} used)")
        return self.leader_of(internal_topic, coordinator_partition(key, len(meta.partitions)))

    def transaction_coordinator(self, transactional_id: str) -> int | None:
        """The node id of ``transactional_id``'s transaction coordinator (None: being moved).

        The leader of the ``__transaction_state`` partition that holds the id, as Kafka's
        FindCoordinator answers.
        """
        return self._coordinator("__transaction_state", transactional_id)

    def group_coordinator(self, group: str) -> int | None:
        """The node id of ``group``'s group coordinator (None: being moved).

        The leader of the ``__consumer_offsets`` partition that holds the group.
        """
        return self._coordinator("__consumer_offsets", group)

    def active_controller(self) -> int:
        """The node id of the quorum's leader, the active controller (``kafka-metadata-quorum``).

        Not the ``controller`` of a metadata response: in KRaft mode that is a random broker.
        """
        result = self.run_tool(
            METADATA_QUORUM_TOOL,
            *("--bootstrap-server", self.bootstrap_servers, "describe", "--status"),
            check=True,
        )
        found = re.search(r"^LeaderId:\s+(\d+)", result.stdout, re.MULTILINE)
        if found is None:
            raise KafkaBrokerError(f"no LeaderId in {result.stdout!r}")
        return int(found.group(1))

    def run_tool(
        self,
        main_class: str,
        *args: str,
        timeout: float = 120.0,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Kafka CLI tool class as :meth:`KafkaBroker.run_tool` does, from a running node.

        Pass ``--bootstrap-server`` yourself (``bootstrap_servers`` names every node).
        """
        up = next((n for n in self.nodes if n.running), None)
        if up is None:
            raise KafkaBrokerError("no node runs")
        return up.run_tool(main_class, *args, timeout=timeout, check=check)
