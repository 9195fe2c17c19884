"""A real single-node Kafka broker (KRaft, combined broker+controller) for tests and humans.

The jars come from Maven Central via ``devenv/fetch-jars.sh`` (cached under
``$EOP_CACHE/kafka/<version>/libs``): ``KAFKA_VERSION`` of devenv/versions.env, or
``KAFKA_FIELD_VERSION``, the 3.x release users still run (``KafkaBroker(version=...)``). The
broker binds 127.0.0.1 only, on free ports, and is configured so that transactions work on a
single node (replication factor 1 for the internal topics, ``transaction.state.log.min.isr=1``).
Topics are never auto-created.

Usage::

    with KafkaBroker(work_dir) as broker:
        broker.create_topic("events", partitions=3)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})

For a shell: ``python -m devenv.kafka up --dir /tmp/kafka`` prints the bootstrap servers and
runs until SIGINT/SIGTERM (``--tls``: TLS and mutual TLS listeners too, see devenv/certs.py;
``--brokers 3``: a replicated cluster, see devenv/kafka_cluster.py; ``--kafka 3.9.1``: a broker
of ``KAFKA_FIELD_VERSION``).
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

from devenv.certs import make_certs
from devenv.processes import (
    QUICK_JVM_OPTIONS,
    Service,
    die_with_parent,
    distinct_free_ports,
    log_tail,
    serve_until_stopped,
    stop_on_signals,
)
from devenv.versions import versions

FETCH_SCRIPT = Path(__file__).with_name("fetch-jars.sh")

#: Main classes of the Kafka CLI tools, for :meth:`KafkaBroker.run_tool`.
CONSUMER_GROUPS_TOOL = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
PRODUCER_PERF_TOOL = "org.apache.kafka.tools.ProducerPerformance"
TOPICS_TOOL = "org.apache.kafka.tools.TopicCommand"
TRANSACTIONS_TOOL = "org.apache.kafka.tools.TransactionsCommand"

_READY_TOPIC = "__eop_broker_ready"
#: The longest one readiness request of a starting broker may take before it is tried again.
READY_ATTEMPT_S = 30.0
_LOG4J2_BROKER = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""
# Tools print their results on stdout; their own logging goes to stderr, warnings only.
_LOG4J2_TOOLS = """\
status = warn
appender.err.type = Console
appender.err.name = ERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = ERR
"""
# The same for Kafka 3.x, which configures log4j 1.x (reload4j) and ignores log4j2 files.
_LOG4J1_BROKER = """\
log4j.rootLogger=INFO, out
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.request.logger=WARN
"""
_LOG4J1_TOOLS = """\
log4j.rootLogger=WARN, err
log4j.appender.err=org.apache.log4j.ConsoleAppender
log4j.appender.err.Target=System.err
log4j.appender.err.layout=org.apache.log4j.PatternLayout
log4j.appender.err.layout.ConversionPattern=[%d] %p %m (%c)%n
"""
#: ``server.properties`` entries that Kafka 3.x does not know (share groups came with 4.0): a
#: 3.x broker is started without them instead of logging each as an unknown setting.
_SINCE_KAFKA_4 = (
    "share.coordinator.state.topic.replication.factor",
    "share.coordinator.state.topic.min.isr",
)


class KafkaBrokerError(RuntimeError):
    """The broker could not be fetched, formatted or started, or a tool failed."""


def _fetch(what: str) -> Path:
    """Run ``fetch-jars.sh WHAT`` and return the directory it prints (fetching if needed)."""
    proc = subprocess.run(
        ["bash", str(FETCH_SCRIPT), what],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise KafkaBrokerError(
            f"{FETCH_SCRIPT.name} {what} failed (exit {proc.returncode}):\n"
            f"{proc.stderr[-4000:]}{proc.stdout[-2000:]}"
        )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise KafkaBrokerError(f"{FETCH_SCRIPT.name} {what} printed no directory:\n{proc.stderr}")
    return Path(lines[-1])


def kafka_libs(version: str | None = None) -> Path:
    """Return the directory of the broker and tools jars of Kafka ``version``, fetching them if
    needed.

    ``version``: ``KAFKA_VERSION`` (the default) or ``KAFKA_FIELD_VERSION`` of
    devenv/versions.env; any other raises :class:`KafkaBrokerError`.
    """
    pinned = versions()
    fetch = {pinned["KAFKA_VERSION"]: "kafka", pinned["KAFKA_FIELD_VERSION"]: "kafka-field"}
    chosen = version or pinned["KAFKA_VERSION"]
    if chosen not in fetch:
        raise KafkaBrokerError(
            f"Kafka {chosen} is not pinned in devenv/versions.env: the releases there are "
            f"{' and '.join(fetch)} (KAFKA_VERSION, KAFKA_FIELD_VERSION)"
        )
    libs = _fetch(fetch[chosen])
    if libs.parent.name != chosen:  # the script and versions.env disagree: never run another
        raise KafkaBrokerError(f"{FETCH_SCRIPT.name} {fetch[chosen]} gave {libs}, not {chosen}")
    return libs


def spark_kafka_jars() -> list[Path]:
    """Return the Spark Kafka connector jars (not shipped by pyspark), fetching them if needed.

    Pass them to Spark as ``spark.jars``: ``",".join(str(j) for j in spark_kafka_jars())``.
    """
    jars = sorted(_fetch("spark").glob("*.jar"))
    if not jars:
        raise KafkaBrokerError("the Spark Kafka connector jar directory is empty")
    return jars


def random_cluster_id() -> str:
    """A Kafka ``Uuid`` as its tools print it: 16 random bytes, URL-safe base64, unpadded."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class KafkaClients:
    """What tests do with a Kafka cluster's admin client: create and delete topics.

    Subclasses say how to reach the cluster (:meth:`client_config`).
    """

    def client_config(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A confluent_kafka config dict for the cluster (``bootstrap.servers``) + ``overrides``."""
        raise NotImplementedError

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        *,
        config: Mapping[str, str] | None = None,
        exist_ok: bool = False,
        timeout: float = 30.0,
        replication_factor: int = -1,
    ) -> None:
        """Create a topic (by default with the brokers' ``default.replication.factor``) and
        wait until all its partitions have leaders.

        Raises :class:`KafkaBrokerError` if it exists already, unless ``exist_ok``.
        """
        from confluent_kafka import KafkaError as ClientError
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        admin = AdminClient(self.client_config({"log_level": 3}))
        futures = admin.create_topics(
            [NewTopic(name, partitions, replication_factor, config=dict(config or {}))],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        tolerated = ClientError.TOPIC_ALREADY_EXISTS if exist_ok else None
        _await_admin(futures[name], f"creating topic {name!r}", timeout, tolerated)
        deadline = time.monotonic() + timeout
        # Every broker answers metadata from its own copy: wait until each one lists the topic,
        # or a client asking another broker next does not find it yet.
        for view in self.metadata_views():
            # A fresh client each time: a client that learnt of other brokers may ask them.
            while not _has_leaders(
                AdminClient({**view, "log_level": 3}), name, partitions, deadline
            ):
                if time.monotonic() > deadline:
                    raise KafkaBrokerError(
                        f"topic {name!r} has no leaders on {view['bootstrap.servers']} "
                        f"after {timeout}s"
                    )
                time.sleep(0.1)

    def metadata_views(self) -> list[dict[str, Any]]:
        """One client config per broker that answers metadata on its own (here: the cluster's)."""
        return [self.client_config()]

    def delete_topic(self, name: str, *, timeout: float = 30.0) -> None:
        """Delete a topic; the brokers remove its log segments in the background.

        Raises :class:`KafkaBrokerError` if the topic does not exist or the deletion fails.
        """
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self.client_config({"log_level": 3}))
        futures = admin.delete_topics([name], operation_timeout=timeout, request_timeout=timeout)
        _await_admin(futures[name], f"deleting topic {name!r}", timeout)


class KafkaBroker(KafkaClients, Service):
    """One Kafka broker in KRaft combined mode, in ``work_dir``, on free 127.0.0.1 ports.

    The ports are picked at the first :meth:`start` and kept: after :meth:`stop`, a new
    :meth:`start` brings the same broker (same data, same ``bootstrap_servers``) back.
    """

    def __init__(
        self,
        work_dir: Path | str,
        *,
        heap: str = "1g",
        overrides: Mapping[str, str] | None = None,
        start_timeout: float = 120.0,
        sasl_plain_users: Mapping[str, str] | None = None,
        tls_certs: Path | str | None = None,
        cluster_address: str | None = None,
        port: int | None = None,
        version: str | None = None,
    ) -> None:
        """Describe a broker; nothing runs until :meth:`start`.

        ``version``: the Kafka release it runs, ``KAFKA_VERSION`` of devenv/versions.env by
        default, or ``KAFKA_FIELD_VERSION`` (see :func:`kafka_libs`).

        ``port``: the PLAINTEXT listener's port (default: a free one), e.g. Kafka's
        usual 9092 for the laptop quick start; the other listeners take free ones.

        ``overrides`` are extra or replacement ``server.properties`` entries.
        ``sasl_plain_users`` (user -> password) adds a ``SASL_PLAINTEXT`` listener on
        a port of its own (:attr:`sasl_bootstrap_servers`) that admits those users
        with the PLAIN mechanism; the PLAINTEXT listener stays as it is.
        ``tls_certs`` (a directory of :func:`devenv.certs.make_certs`) adds two TLS
        listeners with the broker certificate ``broker.pem``: ``SSL``
        (:attr:`tls_bootstrap_servers`, server authentication only) and ``MTLS``
        (:attr:`mtls_bootstrap_servers`, client certificates signed by ``ca.crt``
        required).
        ``cluster_address`` (the multi-node local cluster's gateway, ``10.88.0.1``) adds a
        PLAINTEXT listener ``CLUSTER`` bound on 127.0.0.1 like the others but advertised at
        that address (:attr:`cluster_bootstrap_servers`): pods reach it through the cluster's
        forward of :attr:`cluster_port` (``LocalCluster.expose_host_port``), and the metadata
        they get back names an address they can reach. Host clients keep the other listeners.
        """
        self.work_dir = Path(work_dir).resolve()
        self.version = version or versions()["KAFKA_VERSION"]
        self.heap = heap
        self.overrides = dict(overrides or {})
        self.sasl_plain_users = dict(sasl_plain_users or {})
        self._sasl_port: int | None = None
        self.tls_certs = Path(tls_certs).resolve() if tls_certs is not None else None
        self._tls_ports: tuple[int, int] | None = None
        self.cluster_address = cluster_address
        self._cluster_port: int | None = None
        self.start_timeout = start_timeout
        self.requested_port = port
        self._port: int | None = None
        self._controller_port: int | None = None
        self._libs: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready_topic_created = False
        self._ready_by = 0.0

    # -- properties ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The PLAINTEXT listener's port (known after the first :meth:`start`)."""
        if self._port is None:
            raise KafkaBrokerError("the broker has not been started")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        """``"127.0.0.1:PORT"``, for ``bootstrap.servers`` / ``kafka.bootstrap.servers``."""
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap_servers(self) -> str:
        """``"127.0.0.1:PORT"`` of the SASL_PLAINTEXT listener (``sasl_plain_users`` given)."""
        if self._sasl_port is None:
            raise KafkaBrokerError("the broker has no SASL listener (or has not been started)")
        return f"127.0.0.1:{self._sasl_port}"

    @property
    def tls_bootstrap_servers(self) -> str:
        """``"127.0.0.1:PORT"`` of the TLS listener (server authentication only)."""
        return f"127.0.0.1:{self._tls_port(0)}"

    @property
    def mtls_bootstrap_servers(self) -> str:
        """``"127.0.0.1:PORT"`` of the mutual TLS listener (client certificate required)."""
        return f"127.0.0.1:{self._tls_port(1)}"

    @property
    def cluster_port(self) -> int:
        """The ``CLUSTER`` listener's port on 127.0.0.1 (``cluster_address`` given)."""
        if self._cluster_port is None or self.cluster_address is None:
            raise KafkaBrokerError("the broker has no CLUSTER listener (or has not been started)")
        return self._cluster_port

    @property
    def cluster_bootstrap_servers(self) -> str:
        """``"<cluster_address>:PORT"``: the bootstrap servers for pods of the local cluster."""
        return f"{self.cluster_address}:{self.cluster_port}"

    def _tls_port(self, index: int) -> int:
        if self._tls_ports is None:
            raise KafkaBrokerError("the broker has no TLS listeners (or has not been started)")
        return self._tls_ports[index]

    @property
    def log_path(self) -> Path:
        """The broker's log (stdout and stderr of its JVM, appended across restarts)."""
        return self.work_dir / "broker.log"

    @property
    def data_dir(self) -> Path:
        """The broker's ``log.dirs`` (topic data and KRaft metadata)."""
        return self.work_dir / "data"

    @property
    def libs(self) -> Path:
        """The directory of the jars of Kafka :attr:`version` (fetched on first use)."""
        if self._libs is None:
            self._libs = kafka_libs(self.version)
        return self._libs

    @property
    def major_version(self) -> int:
        """The major version of the Kafka release it runs: 3 or 4."""
        return int(self.version.split(".", 1)[0])

    @property
    def running(self) -> bool:
        """Whether the broker's JVM is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The broker JVM's process id while it runs (e.g. to SIGKILL it in a chaos test)."""
        return self._proc.pid if self.running and self._proc is not None else None

    def client_config(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A confluent_kafka config dict for this broker (``bootstrap.servers``) + ``overrides``."""
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        config.update(overrides or {})
        return config

    # -- lifecycle ----------------------------------------------------------------------------

    def _server_properties(self) -> dict[str, str]:
        port, cport = self.port, self._controller_port
        props = {
            "process.roles": "broker,controller",
            **self._quorum_properties(),
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            # Single node: every internal topic with one replica, so transactions work.
            **replication_properties(1),
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.num.partitions": "4",
            # Small and explicit for tests.
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.recovery.threads.per.data.dir": "1",
            "log.segment.bytes": str(64 * 1024 * 1024),
        }
        if self._sasl_port is not None:
            props.update(self._sasl_properties())
        if self._tls_ports is not None:
            props.update(self._tls_properties(props))
        if self._cluster_port is not None:
            props.update(self._cluster_properties(props))
        props.update(self.overrides)
        if self.major_version < 4:
            for key in _SINCE_KAFKA_4:
                props.pop(key, None)
        return props

    def _quorum_properties(self) -> dict[str, str]:
        """Who this node is and how it finds the KRaft quorum: node 1, its own one-voter quorum."""
        return {
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self._controller_port}",
        }

    def _format_args(self) -> list[str]:
        """``kafka-storage format``'s arguments after ``--config``: a new one-voter cluster."""
        # One argument: a random id may start with "-", which would read as an option.
        return [f"--cluster-id={random_cluster_id()}", "--standalone"]

    def _sasl_properties(self) -> dict[str, str]:
        """The SASL_PLAINTEXT listener: PLAIN, with ``sasl_plain_users``' credentials."""
        sasl_port = self._sasl_port
        users = " ".join(f'user_{name}="{pw}"' for name, pw in self.sasl_plain_users.items())
        return {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
            f"SASL_PLAINTEXT://127.0.0.1:{sasl_port},CONTROLLER://127.0.0.1:{self._controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
            f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
            "listener.security.protocol.map": (
                "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT"
            ),
            "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
            ),
        }

    def _tls_properties(self, props: Mapping[str, str]) -> dict[str, str]:
        """The SSL and MTLS listeners, added to the listeners in ``props``; PEM files."""
        assert self._tls_ports is not None and self.tls_certs is not None
        ssl_port, mtls_port = self._tls_ports
        added = f"SSL://127.0.0.1:{ssl_port},MTLS://127.0.0.1:{mtls_port}"
        return {
            "listeners": f"{added},{props['listeners']}",
            "advertised.listeners": f"{added},{props['advertised.listeners']}",
            "listener.security.protocol.map": (
                f"SSL:SSL,MTLS:SSL,{props['listener.security.protocol.map']}"
            ),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.tls_certs / "broker.pem"),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.tls_certs / "ca.crt"),
            "listener.name.mtls.ssl.client.auth": "required",
        }

    def _cluster_properties(self, props: Mapping[str, str]) -> dict[str, str]:
        """The CLUSTER listener: on 127.0.0.1, advertised at ``cluster_address``."""
        port = self._cluster_port
        return {
            "listeners": f"CLUSTER://127.0.0.1:{port},{props['listeners']}",
            "advertised.listeners": (
                f"CLUSTER://{self.cluster_address}:{port},{props['advertised.listeners']}"
            ),
            "listener.security.protocol.map": (
                f"CLUSTER:PLAINTEXT,{props['listener.security.protocol.map']}"
            ),
        }

    def _java(self, heap: str, *, tool: bool, main_class: str, args: Sequence[str]) -> list[str]:
        """The command of a broker (or a ``tool``'s) JVM, its logging configuration written.

        Kafka 4 logs with log4j2, Kafka 3 with log4j 1.x (reload4j): each reads its own
        file and system property.
        """
        prefix = "tools-" if tool else ""
        if self.major_version < 4:
            config = self.work_dir / f"{prefix}log4j.properties"
            text = _LOG4J1_TOOLS if tool else _LOG4J1_BROKER
            logging = f"-Dlog4j.configuration=file:{config}"
        else:
            config = self.work_dir / f"{prefix}log4j2.properties"
            text = _LOG4J2_TOOLS if tool else _LOG4J2_BROKER
            logging = f"-Dlog4j2.configurationFile={config}"
        # Written once: a tool may run while another starts, and must not read a truncated file.
        if not config.exists() or config.read_text() != text:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            config.write_text(text)
        return [
            "java",
            *QUICK_JVM_OPTIONS,
            f"-Xmx{heap}",
            "-Djava.awt.headless=true",
            logging,
            "-cp",
            f"{self.libs}/*",
            main_class,
            *args,
        ]

    def _tool_java(self, main_class: str, *args: str) -> list[str]:
        """A short-lived tool JVM: small heap, warnings only on stderr."""
        return self._java("512m", tool=True, main_class=main_class, args=args)

    def _write_configs(self) -> Path:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        ports = [
            self.port,
            self._controller_port,
            self._sasl_port,
            *(self._tls_ports or ()),
            self._cluster_port,
        ]
        self._ports_file().write_text(" ".join(str(p) for p in ports if p is not None) + "\n")
        props = self.work_dir / "server.properties"
        props.write_text("".join(f"{k}={v}\n" for k, v in self._server_properties().items()))
        return props

    def _format(self, props: Path) -> None:
        if (self.data_dir / "meta.properties").exists():
            return  # a restart: keep the data
        cmd = self._tool_java(
            "kafka.tools.StorageTool",
            "format",
            "--config",
            str(props),
            *self._format_args(),
        )
        for attempt in (1, 2):
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
            if proc.returncode == 0:
                self._unclean_marker.unlink(missing_ok=True)  # a new broker: nothing to fence
                return
            # Once seen here: exit without a word (the JVM killed?). Retry once if it left
            # nothing behind; a real error (bad config) fails the same way twice.
            if attempt == 2 or (self.data_dir / "meta.properties").exists():
                break
            shutil.rmtree(self.data_dir, ignore_errors=True)
        raise KafkaBrokerError(
            f"formatting {self.data_dir} failed (exit {proc.returncode}):\n"
            f"{proc.stdout}{proc.stderr}"
        )

    def start(self) -> Self:
        """Format (first time only) and start the broker; return once transactions work.

        Raises :class:`KafkaBrokerError`, with the tail of the broker log, if it does not come up
        within ``start_timeout`` seconds.
        """
        if self.running:
            return self
        if self._port is None and (self.data_dir / "meta.properties").exists():
            self._load_ports()  # an existing broker dir: same ports, same data
            if self.requested_port not in (None, self._port):
                raise KafkaBrokerError(
                    f"the broker in {self.work_dir} listens on port {self._port}, not "
                    f"{self.requested_port}: use another directory for another port"
                )
        fresh = self._port is None
        # A port asked for stays: a race for it cannot be won by trying again.
        attempts = 3 if fresh and self.requested_port is None else 1
        for attempt in range(attempts):
            if fresh:
                count = (
                    2
                    + bool(self.sasl_plain_users)
                    + 2 * (self.tls_certs is not None)
                    + (self.cluster_address is not None)
                )
                ports = distinct_free_ports(count)
                if self.requested_port is not None:
                    others = [p for p in ports if p != self.requested_port]
                    ports = [self.requested_port, *others[: count - 1]]
                self._assign_ports(ports)
            try:
                self._start_once()
                return self
            except KafkaBrokerError:
                bind_race = "Address already in use" in log_tail(self.log_path, 200)
                if not (fresh and bind_race and attempt + 1 < attempts):
                    raise
                # Something took a port between probing and binding: new ports, and a fresh
                # format (the KRaft quorum records the controller's endpoint).
                shutil.rmtree(self.data_dir, ignore_errors=True)
                self._ready_topic_created = False
        raise AssertionError("unreachable")

    def _ports_file(self) -> Path:
        return self.work_dir / "ports"

    def _assign_ports(self, ports: list[int]) -> None:
        """Take the listeners' ports in the ports file's order (optional ones when configured)."""
        self._port, self._controller_port = ports.pop(0), ports.pop(0)
        self._sasl_port = ports.pop(0) if self.sasl_plain_users and ports else None
        self._tls_ports = (
            (ports.pop(0), ports.pop(0)) if self.tls_certs is not None and len(ports) >= 2 else None
        )
        self._cluster_port = ports.pop(0) if self.cluster_address is not None and ports else None

    def _load_ports(self) -> None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            self._assign_ports([int(p) for p in self._ports_file().read_text().split()])

    @property
    def _unclean_marker(self) -> Path:
        """Exists while a broker JVM may be running; left behind by a crash or a kill."""
        return self.work_dir / "broker.running"

    def _spawn(self, props: Path, log_path: Path, banner: str) -> subprocess.Popen[bytes]:
        with log_path.open("ab") as log:
            log.write(f"\n==== eop: {banner}\n".encode())
            log.flush()
            return subprocess.Popen(
                self._java(self.heap, tool=False, main_class="kafka.Kafka", args=[str(props)]),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work_dir,
                start_new_session=True,
                # PR_SET_PDEATHSIG fires when the spawning *thread* ends: main thread only.
                preexec_fn=(
                    die_with_parent
                    if threading.current_thread() is threading.main_thread()
                    else None
                ),
            )

    def _start_once(self) -> None:
        self._launch(self._prepare())
        self._await_ready()

    def _prepare(self) -> Path:
        """Write the configuration, format (first time), fence a crashed incarnation."""
        _ = self.libs  # fetch before the clock starts
        props = self._write_configs()
        self._format(props)
        # Kafka leaves .kafka_cleanshutdown after a controlled shutdown and removes it on start.
        if self._unclean_marker.exists() and not (self.data_dir / ".kafka_cleanshutdown").exists():
            self._fence_stale_registration(props, time.monotonic() + self.start_timeout)
        return props

    def _launch(self, props: Path) -> None:
        """Start the JVM (from the thread it should die with); :meth:`_await_ready` waits."""
        self._unclean_marker.write_text("")
        self._proc = self._spawn(
            props, self.log_path, f"starting broker on {self.bootstrap_servers}"
        )
        self._ready_by = time.monotonic() + self.start_timeout

    def _await_ready(self) -> None:
        """Wait until the launched broker works; kill it and raise with its log tail if not."""
        try:
            self._wait_ready(self._ready_by)
        except BaseException as exc:
            self._kill()
            if isinstance(exc, KafkaBrokerError):
                raise KafkaBrokerError(
                    f"{exc}\n--- tail of {self.log_path} ---\n{log_tail(self.log_path, 60)}"
                ) from None
            raise

    def _fence_stale_registration(self, props: Path, deadline: float) -> None:
        """After a crash, let a controller-only run fence the dead broker before restarting.

        In combined mode the restarted controller still holds the crashed broker's registration
        until its session times out (``broker.session.timeout.ms``), and until then the new
        broker cannot register but already acts as leader and transaction coordinator. If the
        crash came right after a commit, the coordinator then drops the pending COMMIT markers
        when the stale registration is fenced ("Couldn't find leader endpoint ... likely
        deleted") and the partition's last stable offset hangs forever (Kafka 4.3.1, seen in
        about a third of kill-restarts). Fencing first makes the broker come back as a new
        incarnation whose coordinator re-sends the markers.
        """
        server = dict(line.split("=", 1) for line in props.read_text().splitlines() if "=" in line)
        server["process.roles"] = "controller"
        server["listeners"] = f"CONTROLLER://127.0.0.1:{self._controller_port}"
        for key in ("advertised.listeners", "inter.broker.listener.name"):
            server.pop(key, None)
        controller_props = self.work_dir / "controller.properties"
        controller_props.write_text("".join(f"{k}={v}\n" for k, v in server.items()))
        log_path = self.work_dir / "fence.log"
        size = log_path.stat().st_size if log_path.exists() else 0
        proc = self._spawn(
            controller_props, log_path, "unclean shutdown: fencing the stale broker registration"
        )
        session_timeout = int(server.get("broker.session.timeout.ms", "9000")) / 1000
        activated: float | None = None
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                with log_path.open("rb") as log:
                    log.seek(size)
                    text = log.read()
                timed_out = text.find(b"because its session has timed out")
                if timed_out >= 0 and b"fenced=1" in text[timed_out:]:
                    # The fencing record is replayed; give the quorum a moment to make it
                    # durable (a SIGTERM 6 ms after the timeout line once lost it, and the
                    # restarted broker hit the stale registration all the same).
                    time.sleep(1.0)
                    break
                if activated is None and b"Performing controller activation" in text:
                    activated = time.monotonic()
                if activated is not None and time.monotonic() > activated + session_timeout + 5:
                    break  # nothing to fence after all
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def _wait_ready(self, deadline: float) -> None:
        """Wait until a transactional producer can commit on the broker."""
        last_error = "the listener never accepted a connection"
        while time.monotonic() < deadline:
            if not self.running:
                code = self._proc.returncode if self._proc else None
                raise KafkaBrokerError(f"the broker exited during startup (exit code {code})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
            except OSError:
                time.sleep(0.2)
                continue
            try:
                self._probe_transactions(deadline)
                return
            except KafkaBrokerError as exc:  # anything else is a bug: raise it at once
                last_error = str(exc)
                time.sleep(0.5)
        raise KafkaBrokerError(
            f"the broker was not ready within {self.start_timeout:.0f}s: {last_error}"
        )

    def _probe_transactions(self, deadline: float) -> None:
        from confluent_kafka import KafkaException, Producer

        if not self._ready_topic_created:
            # Each attempt bounded (the caller tries again until its deadline): once, a node
            # of a 3-node cluster starting under load never answered one CreateTopics request,
            # though the topic was made, and a single wait used up the whole start timeout.
            attempt = min(max(1.0, deadline - time.monotonic()), READY_ATTEMPT_S)
            self.create_topic(_READY_TOPIC, 1, exist_ok=True, timeout=attempt)
            self._ready_topic_created = True
        timeout = min(max(1.0, deadline - time.monotonic()), READY_ATTEMPT_S)
        producer = Producer(
            self.client_config(
                {
                    "transactional.id": f"eop-ready-{uuid.uuid4().hex[:8]}",
                    "transaction.timeout.ms": 60000,
                    "log_level": 3,
                }
            )
        )
        try:
            producer.init_transactions(timeout)
            producer.begin_transaction()
            producer.produce(_READY_TOPIC, b"ready")
            producer.commit_transaction(timeout)
        except KafkaException as exc:
            raise KafkaBrokerError(f"transactional probe failed: {exc}") from exc
        finally:
            producer.close()

    def terminate(self) -> None:
        """SIGTERM the broker (a controlled shutdown begins) without waiting for it to end."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker: SIGTERM (controlled shutdown), then SIGKILL after ``timeout``."""
        proc = self._proc
        if proc is None:
            return
        clean = False
        if proc.poll() is None:
            self.terminate()
            try:
                proc.wait(timeout)
                clean = True
            except subprocess.TimeoutExpired:
                self._kill()
        if clean:
            self._unclean_marker.unlink(missing_ok=True)
        self._proc = None

    def kill(self) -> None:
        """SIGKILL the broker (a crash: no controlled shutdown). :meth:`start` restarts it."""
        self._kill()
        self._proc = None

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(30)

    # -- helpers ------------------------------------------------------------------------------

    def run_tool(
        self,
        main_class: str,
        *args: str,
        timeout: float = 120.0,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Kafka CLI tool class (``java -cp libs/* MAIN_CLASS ARGS``) and return its result.

        E.g. ``run_tool(CONSUMER_GROUPS_TOOL, "--bootstrap-server", b.bootstrap_servers,
        "--describe", "--group", "g")``. Pass ``--bootstrap-server`` yourself. Output is text;
        the tool's logging (warnings only) goes to stderr. With ``check``, a non-zero exit raises
        :class:`KafkaBrokerError`.
        """
        proc = subprocess.run(
            self._tool_java(main_class, *args),
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise KafkaBrokerError(
                f"{main_class} {' '.join(args)} exited {proc.returncode}:\n"
                f"{proc.stdout}{proc.stderr}"
            )
        return proc


T = TypeVar("T")


def replication_properties(replicas: int) -> dict[str, str]:
    """Brokers' settings for ``replicas`` copies of every partition, internal ones included.

    One broker may be lost without losing a write: ``min.insync.replicas`` is one less than
    the replicas (at least 1), so an acknowledged write is on two brokers once there are 3.
    """
    rf, isr = str(replicas), str(max(1, replicas - 1))
    return {
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
    }


def until_coordinator_ready(call: Callable[[], T], timeout: float = 60) -> T:
    """``call()``, again while a fresh broker's group coordinator is loading or moving."""
    from confluent_kafka import KafkaException

    from eop_spark.exactly_once.progress_group import retriable  # the runner's rule

    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except KafkaException as exc:
            if not retriable(exc.args[0]) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _has_leaders(admin: Any, name: str, partitions: int, deadline: float) -> bool:
    """Whether ``admin``'s broker lists topic ``name`` with ``partitions`` partitions, each
    with a leader."""
    from confluent_kafka import KafkaException

    try:
        meta = admin.list_topics(name, timeout=max(1.0, deadline - time.monotonic()))
    except KafkaException as exc:
        raise KafkaBrokerError(f"describing topic {name!r} failed: {exc}") from exc
    topic = meta.topics.get(name)
    return (
        topic is not None
        and topic.error is None
        and len(topic.partitions) >= partitions
        and all(p.leader >= 0 for p in topic.partitions.values())
    )


def _await_admin(
    future: concurrent.futures.Future[Any], what: str, timeout: float, tolerated: int | None = None
) -> None:
    """Wait for an admin request; raise KafkaBrokerError unless its error is ``tolerated``."""
    from confluent_kafka import KafkaException

    try:
        future.result(timeout)
    except KafkaException as exc:
        err = exc.args[0]
        if tolerated is None or err.code() != tolerated:
            raise KafkaBrokerError(f"{what} failed: {err}") from exc
    except concurrent.futures.TimeoutError as exc:
        raise KafkaBrokerError(f"{what} timed out after {timeout}s") from exc


def _topic_list(text: str) -> list[tuple[str, int]]:
    """``--topics impressions-raw:3,impressions-clean:3`` as (name, partitions) pairs."""
    topics = []
    for item in text.split(","):
        name, _, count = item.strip().partition(":")
        if not name or not count.isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: expected NAME:PARTITIONS")
        topics.append((name, int(count)))
    return topics


def _up(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m devenv.kafka")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a broker and run until SIGINT/SIGTERM")
    up.add_argument("--dir", required=True, type=Path, help="work dir (config, data, log)")
    up.add_argument("--heap", default="1g", help="broker JVM max heap (default 1g)")
    up.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="nodes of a replicated cluster (3: replication factor 3, min.insync.replicas 2)",
    )
    up.add_argument(
        "--tls",
        action="store_true",
        help="also listen with TLS and mutual TLS (certificates made in DIR/certs)",
    )
    up.add_argument("--port", type=int, help="the PLAINTEXT listener's port (default: a free one)")
    pinned = versions()
    up.add_argument(
        "--kafka",
        choices=[pinned["KAFKA_VERSION"], pinned["KAFKA_FIELD_VERSION"]],
        default=pinned["KAFKA_VERSION"],
        help="the Kafka release of the broker or of every node (default: %(default)s)",
    )
    up.add_argument(
        "--topics",
        type=_topic_list,
        default=[],
        metavar="NAME:PARTITIONS,...",
        help="create these topics once the broker is up (topics are never auto-created)",
    )
    sub.add_parser("jars", help="fetch the jars and print the Spark connector jar paths")
    args = parser.parse_args(argv)

    if args.command == "jars":
        print(kafka_libs())
        for jar in spark_kafka_jars():
            print(jar)
        return 0

    if args.brokers > 1:
        if args.tls or args.port is not None:
            parser.error("--tls and --port are for one broker only")
        return _serve_cluster(args)
    stop = stop_on_signals()
    started = time.monotonic()
    certs = make_certs(args.dir / "certs").directory if args.tls else None
    broker = KafkaBroker(
        args.dir, heap=args.heap, tls_certs=certs, port=args.port, version=args.kafka
    ).start()
    try:
        for name, partitions in args.topics:
            broker.create_topic(name, partitions, exist_ok=True)
        tls = (
            f"TLS: {broker.tls_bootstrap_servers}, mutual TLS: {broker.mtls_bootstrap_servers} "
            f"(CA and client certificates in {certs})\n"
            if certs is not None
            else ""
        )
        print(
            f"Kafka {broker.version} up in {time.monotonic() - started:.1f}s\n"
            f"bootstrap servers: {broker.bootstrap_servers}\n{tls}{_topics_line(args.topics)}"
            f"log: {broker.log_path}\n"
            "Ctrl-C to stop.",
            flush=True,
        )
        if not serve_until_stopped(stop, lambda: broker.running):
            print(f"the broker exited; see {broker.log_path}", file=sys.stderr)
            return 1
    finally:
        broker.stop()
    return 0


def _topics_line(topics: Sequence[tuple[str, int]]) -> str:
    return "".join(f"topic {name}: {count} partitions\n" for name, count in topics)


def _serve_cluster(args: argparse.Namespace) -> int:
    """``up --brokers N``: a replicated cluster until SIGINT/SIGTERM, or until a node exits."""
    from devenv.kafka_cluster import KafkaCluster  # it builds on this module

    stop = stop_on_signals()
    started = time.monotonic()
    cluster = KafkaCluster(
        args.dir, brokers=args.brokers, heap=args.heap, version=args.kafka
    ).start()
    try:
        for name, partitions in args.topics:
            cluster.create_topic(name, partitions, exist_ok=True)
        logs = "".join(f"node {n.node_id} log: {n.log_path}\n" for n in cluster.nodes)
        print(
            f"Kafka {args.kafka}, {args.brokers} nodes, up in "
            f"{time.monotonic() - started:.1f}s\n"
            f"bootstrap servers: {cluster.bootstrap_servers}\n{_topics_line(args.topics)}{logs}"
            "Ctrl-C to stop.",
            flush=True,
        )
        if not serve_until_stopped(stop, lambda: len(cluster.running) == args.brokers):
            print(f"a node exited; see the logs in {cluster.work_dir}", file=sys.stderr)
            return 1
    finally:
        cluster.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point: ``python -m devenv.kafka up --dir DIR``."""
    return _up(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
