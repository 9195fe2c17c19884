"""Ask the Kafka clusters what only they can tell of a spec, before a driver starts.

Two mistakes in a spec are invisible to the API server: a sink topic the
source reads from the same cluster (compared by cluster id, however the
brokers are written), and a ``sink.kafka.transactionTimeout`` above the sink
brokers' ``transaction.max.timeout.ms``.  The runner refuses both in its first
seconds; the operator asks the same questions with the runner's own code
(``eop_spark.operator_access``) so that such a pipeline never gets a
driver.

Every request is bounded, and a TCP probe of the bootstrap servers comes
first: a cluster nobody listens for is reported in milliseconds, not after a
metadata timeout.  The calls block; :func:`ask_clusters` runs in a worker
thread.
"""

from __future__ import annotations

import socket

from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.health.progress import KafkaAccess
from eop_spark.contract.errors import EnvironmentNotReady
from eop_spark.operator_access import check_clusters

#: Seconds each Kafka request of a check may take.
REQUEST_TIMEOUT_S = 5.0
#: Seconds a TCP connection to one bootstrap server may take to open.
PROBE_TIMEOUT_S = 2.0


def _host_port(server: str) -> tuple[str, int]:
    host, _, port = server.strip().rpartition(":")
    return host.strip("[]"), int(port)


def probe(servers: str, role: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise :class:`EnvironmentNotReady` unless one of ``servers`` accepts a TCP connection.

    ``servers``: a bootstrap list (``host:port,...``; the CRD checks its shape).
    """
    failures = []
    for server in servers.split(","):
        try:
            with socket.create_connection(_host_port(server), timeout=timeout):
                return
        except (OSError, ValueError) as exc:
            failures.append(f"{server.strip()}: {exc}")
    raise EnvironmentNotReady(
        f"cannot reach the {role} Kafka cluster at {servers} ({'; '.join(failures)})"
    )


def ask_clusters(
    access: KafkaAccess, pipeline: ExactlyOncePipeline, timeout: float = REQUEST_TIMEOUT_S
) -> None:
    """Refuse what the clusters say of ``pipeline``'s spec (blocking).

    Raises ``ConfigError`` naming the field the clusters refuse, and
    ``EnvironmentNotReady`` when a cluster cannot be asked.
    """
    kafka, sink_kafka = pipeline.spec.source.kafka, pipeline.spec.sink.kafka
    probe(kafka.bootstrap_servers, "source")
    probe(sink_kafka.bootstrap_servers, "sink")
    check_clusters(access.source, access.sink, kafka, sink_kafka, timeout)
