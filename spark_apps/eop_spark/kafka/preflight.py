"""Checks before Spark starts: brokers reachable, topics present; a cluster's id.

They run in seconds with librdkafka, so a typo in a topic name or an
unreachable broker fails the runner quickly with one clear line, instead of a
Spark query that waits forever on a topic that never appears.  Two mistakes
only the clusters can reveal are refused the same way, naming the field: a
sink topic the source reads (on the same cluster however its brokers are
written), and a transaction timeout above the sink brokers' maximum.  A failed TLS
handshake is named by its cause: a cluster certificate the pipeline's CA did
not sign, a client certificate that has expired or that the cluster refuses.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eop_spark.contract.errors import ConfigError, EnvironmentNotReady
from eop_spark.contract.offsets import TopicPartition
from eop_spark.contract.spec import Duration, KafkaSink, KafkaSource
from eop_spark.kafka.client_config import EAGER_CONNECTIONS

#: How long a metadata request may take before the broker counts as unreachable.
METADATA_TIMEOUT_S = 10.0


def _metadata(client_config: Mapping[str, Any], role: str, timeout: float) -> Any:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    # librdkafka reports a refused login only to the error callback; the metadata request
    # then fails as a transport failure, which would read as an unreachable broker.
    refused: list[str] = []
    login_errors = (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED)
    handshakes: list[str] = []

    def on_error(error: Any) -> None:
        if error.code() in login_errors:
            refused.append(error.str())
        elif _TLS_REFUSED.search(error.str()):
            handshakes.append(error.str())

    conf = {**EAGER_CONNECTIONS, **client_config, "log_level": 0, "error_cb": on_error}
    admin = AdminClient(conf)
    servers = client_config["bootstrap.servers"]
    try:
        return admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        admin.poll(0)  # serves the error callback
        if refused:
            raise EnvironmentNotReady(
                f"the {role} Kafka cluster at {servers} refused the login: {refused[0]}"
            ) from exc
        if handshakes:
            raise EnvironmentNotReady(_tls_failure(client_config, role, handshakes[0])) from exc
        raise EnvironmentNotReady(
            f"cannot reach the {role} Kafka cluster at {servers}: {exc.args[0].str()}"
        ) from exc


#: librdkafka's words for a TLS handshake that failed on a certificate (either side's).
_TLS_REFUSED = re.compile(r"certificate verify failed|alert (bad certificate|certificate \w+)")


def _tls_failure(client_config: Mapping[str, Any], role: str, error: str) -> str:
    """The cause of a failed TLS handshake in the user's words (no key material)."""
    servers = client_config["bootstrap.servers"]
    if "certificate verify failed" in error:
        return (
            f"the {role} Kafka cluster's certificate is not signed by the CA in the {role} "
            f"Secret (ca.crt or ssl.ca.pem; or ssl.ca.location): TLS certificate verify failed "
            f"at {servers}"
        )
    certificate = client_config.get("ssl.certificate.pem")
    location = client_config.get("ssl.certificate.location")
    if certificate is None and location is not None and Path(location).is_file():
        certificate = Path(location).read_text()
    if certificate is None:
        return (
            f"the {role} Kafka cluster at {servers} asks for a client certificate: put "
            f"user.crt and user.key (or ssl.certificate.pem and ssl.key.pem) in the {role} Secret"
        )
    expiry = certificate_not_after(certificate)
    if expiry is not None and expiry <= datetime.now(UTC):
        return (
            f"the client certificate in the {role} Secret (user.crt or ssl.certificate.pem) "
            f"has expired ({expiry:%Y-%m-%d %H:%M:%S} UTC): the {role} Kafka cluster at "
            f"{servers} refused it"
        )
    return (
        f"the {role} Kafka cluster at {servers} refused the client certificate in the {role} "
        "Secret (user.crt or ssl.certificate.pem): it is not signed by a CA the cluster trusts"
    )


_PEM_CERTIFICATE = re.compile(
    r"-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----", re.DOTALL
)


def certificate_not_after(pem: str) -> datetime | None:
    """When the first certificate in ``pem`` expires (its X.509 ``notAfter``); None: unreadable.

    Read from the DER structure (Certificate -> TBSCertificate -> Validity):
    Python's ``ssl`` module decodes PEM but has no public parser of certificates.
    """
    match = _PEM_CERTIFICATE.search(pem)
    if match is None:
        return None
    try:
        der = ssl.PEM_cert_to_DER_cert(match.group(0))
        _, tbs, _ = _der(der, _der(der, 0)[1])  # the certificate's first element
        fields: list[tuple[int, int, int]] = []
        position = tbs
        while len(fields) < 5:
            fields.append(_der(der, position))
            position = fields[-1][2]
        # version (explicit, [0]; absent in v1), serialNumber, signature, issuer, validity
        _, validity, _ = fields[4] if fields[0][0] == 0xA0 else fields[3]
        not_before_end = _der(der, validity)[2]
        tag, start, end = _der(der, not_before_end)
        text = der[start:end].decode("ascii")
        layout = "%y%m%d%H%M%SZ" if tag == 0x17 else "%Y%m%d%H%M%SZ"
        return datetime.strptime(text, layout).replace(tzinfo=UTC)
    except (ValueError, IndexError, UnicodeDecodeError):
        return None


def _der(data: bytes, position: int) -> tuple[int, int, int]:
    """The DER element at ``position``: its tag, where its content starts and ends."""
    tag, length = data[position], data[position + 1]
    position += 2
    if length & 0x80:
        count = length & 0x7F
        length = int.from_bytes(data[position : position + count], "big")
        position += count
    if position + length > len(data):
        raise ValueError("truncated DER")
    return tag, position, position + length


@dataclass(frozen=True)
class Cluster:
    """What one metadata request told of a Kafka cluster: its id and its topics."""

    role: str
    servers: str
    #: The cluster id (None: the cluster did not tell).
    id: str | None
    #: Topic -> its partitions (topics the cluster reported without an error).
    topics: dict[str, list[int]]
    #: The ids of the cluster's brokers.
    brokers: tuple[int, ...] = ()

    def same_as(self, other: Cluster) -> bool:
        """Whether ``other`` is this cluster: the same cluster id (the same servers when
        either cluster tells none), however its brokers are written."""
        if self.id is not None and other.id is not None:
            return self.id == other.id
        return self.servers == other.servers


def cluster(
    client_config: Mapping[str, Any], role: str, timeout: float = METADATA_TIMEOUT_S
) -> Cluster:
    """Ask the ``role`` ("source" or "sink") cluster for its metadata; fails with one line."""
    metadata = _metadata(client_config, role, timeout)
    return Cluster(
        role=role,
        servers=str(client_config["bootstrap.servers"]),
        id=metadata.cluster_id or None,
        topics={
            name: sorted(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None
        },
        brokers=tuple(sorted(metadata.brokers)),
    )


def cluster_id(client_config: Mapping[str, Any], role: str, timeout: float = 10.0) -> str | None:
    """The id of the Kafka cluster ``client_config`` reaches (None: it does not tell).

    Raises :class:`EnvironmentNotReady` naming ``role`` ("source", "sink")
    when the cluster does not answer.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({**EAGER_CONNECTIONS, **client_config, "log_level": 0})
    try:
        described = admin.describe_cluster(request_timeout=timeout).result(timeout=timeout)
    except (KafkaException, TimeoutError) as exc:
        raise EnvironmentNotReady(
            f"cannot ask the {role} Kafka cluster at {client_config.get('bootstrap.servers')} "
            f"for its cluster id: {exc}"
        ) from exc
    return str(described.cluster_id) if described.cluster_id else None


def source_partitions(
    source: Cluster, topics: list[str] | None, pattern: str | None
) -> list[TopicPartition]:
    """The source's topic-partitions; every listed topic must exist."""
    if topics is None:
        assert pattern is not None
        regex = re.compile(pattern)
        # Internal topics (__consumer_offsets, ...) never match, as the Spark source's pattern.
        topics = sorted(t for t in source.topics if not t.startswith("__") and regex.fullmatch(t))
    result: list[TopicPartition] = []
    for topic in topics:
        partitions = source.topics.get(topic)
        if partitions is None:
            raise EnvironmentNotReady(f"source topic {topic!r} does not exist on {source.servers}")
        result.extend((topic, p) for p in partitions)
    return result


def sink_partition_count(sink: Cluster, topic: str) -> int:
    """How many partitions the sink topic has; it must exist (the runner never creates it)."""
    partitions = sink.topics.get(topic)
    if partitions is None:
        raise EnvironmentNotReady(f"sink topic {topic!r} does not exist on {sink.servers}")
    return len(partitions)


def refuse_own_output(source: Cluster, sink: Cluster, kafka: KafkaSource, sink_topic: str) -> None:
    """Refuse a sink topic that the source reads from the same cluster.

    The pipeline would read its own output, each batch feeding the next.  The
    clusters are compared by id, so the same cluster written with its brokers in
    another order or by other host names is caught too.  A topic pattern is
    matched with Python's ``re`` as :meth:`KafkaSource.reads` does (whole names,
    internal topics never): no JVM runs yet to compile it as Spark does, and the
    syntax the spec accepts means the same to both engines.
    """
    if not source.same_as(sink) or not kafka.reads(sink_topic):
        return
    field = (
        f"spec.source.kafka.topics {kafka.topics}"
        if kafka.topics is not None
        else f"spec.source.kafka.topicPattern {kafka.topic_pattern!r}"
    )
    cluster = f"cluster id {source.id}" if source.id is not None else "the same servers"
    raise ConfigError(
        f"spec.sink.kafka.topic {sink_topic!r} is read by {field} on the same Kafka cluster "
        f"({cluster}: source at {source.servers}, sink at {sink.servers}): the pipeline would "
        "read its own output; write to a topic the source does not read"
    )


#: The broker setting that bounds every producer's transaction.timeout.ms.
MAX_TRANSACTION_TIMEOUT = "transaction.max.timeout.ms"


def refuse_long_transactions(
    client_config: Mapping[str, Any],
    sink: Cluster,
    transaction_timeout: Duration,
    timeout: float = METADATA_TIMEOUT_S,
) -> None:
    """Refuse a ``spec.sink.kafka.transactionTimeout`` above a sink broker's maximum.

    The broker refuses such a producer at its first transaction
    (INVALID_TRANSACTION_TIMEOUT), after Spark has started; here it is one line
    naming both numbers.  Each broker's ``transaction.max.timeout.ms`` is read in
    its own request (librdkafka takes one broker resource per request), all at
    once.  A broker that does not answer (no DESCRIBE_CONFIGS right) is skipped:
    the producer reports the refusal then.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._config import ConfigResource
    from confluent_kafka.admin._resource import ResourceType

    def resource(broker: int) -> ConfigResource:
        return ConfigResource(ResourceType.BROKER, str(broker))

    timeout_ms = transaction_timeout.ms
    admin = AdminClient({**EAGER_CONNECTIONS, **client_config, "log_level": 0})
    requests = [
        (broker, admin.describe_configs([resource(broker)], request_timeout=timeout))
        for broker in sink.brokers
    ]
    maxima: dict[int, int] = {}
    for broker, futures in requests:
        for future in futures.values():
            try:
                entry = future.result(timeout=timeout).get(MAX_TRANSACTION_TIMEOUT)
            except (KafkaException, TimeoutError):
                continue
            if entry is not None and entry.value:
                maxima[broker] = int(entry.value)
    if not maxima:
        return
    broker, maximum = min(maxima.items(), key=lambda item: item[1])
    if timeout_ms > maximum:
        raise ConfigError(
            f"spec.sink.kafka.transactionTimeout {transaction_timeout} ({timeout_ms} ms) is "
            f"above {MAX_TRANSACTION_TIMEOUT} {maximum} of broker {broker} of the sink cluster "
            f"at {sink.servers}: the broker refuses every transaction; lower "
            f"transactionTimeout to at most {maximum} ms, or raise {MAX_TRANSACTION_TIMEOUT} "
            "on the brokers"
        )


def check_clusters(
    source_config: Mapping[str, Any],
    sink_config: Mapping[str, Any],
    source: KafkaSource,
    sink: KafkaSink,
    timeout: float = METADATA_TIMEOUT_S,
) -> tuple[Cluster, Cluster]:
    """Ask both clusters for their metadata and refuse what only they reveal of the spec.

    A sink topic the source reads (:func:`refuse_own_output`), a transaction
    timeout above the sink brokers' maximum (:func:`refuse_long_transactions`):
    the runner asks as it starts, the operator before a driver starts.
    Returns the source and sink clusters.
    """
    source_cluster = cluster(source_config, "source", timeout)
    sink_cluster = cluster(sink_config, "sink", timeout)
    refuse_own_output(source_cluster, sink_cluster, source, sink.topic)
    refuse_long_transactions(sink_config, sink_cluster, sink.transaction_timeout, timeout)
    return source_cluster, sink_cluster
