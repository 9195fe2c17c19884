"""Kafka client settings: the spec's options merged with mounted Secrets.

Three kinds of clients talk to Kafka:

* Spark's Kafka source (Java client) reads the source cluster;
* librdkafka clients of the runner read source metadata (topic checks) and,
  on the sink cluster, the progress group ``G`` and the transactional producers.

A Secret directory holds one client property per file (``sasl.mechanism``,
``sasl.username``...), as Kubernetes mounts Secrets.  Values are read here
and passed to the clients; they are never logged (only property names are).
A Secret in the shape of Strimzi's ``KafkaUser`` (``ca.crt``, ``user.crt``,
``user.key``) gives the TLS material: see :func:`secret_client_properties`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from eop_spark.contract.errors import ConfigError
from eop_spark.contract.owned_settings import SINK_OPTIONS, SOURCE_OPTIONS, OwnedKeys
from eop_spark.contract.run_config import RunConfig
from eop_spark.contract.spec import KafkaSink, KafkaSource

log = logging.getLogger(__name__)


# Java client properties librdkafka refuses with other messages than "no such property".
_JAVA_ONLY_PREFIXES = ("ssl.truststore.", "ssl.keystore.", "sasl.jaas.config", "sasl.login.")
_UNKNOWN_PROPERTY = re.compile(r'No such configuration property: "([^"]+)"')


def read_secret_dir(directory: str | None, secret: str | None = None) -> dict[str, str]:
    """Read a mounted Secret: each regular file is a property, its content the value.

    Kubernetes' bookkeeping entries (``..data`` and other dot names) are skipped;
    the rest is decoded as :func:`secret_text` does (``secret``: the Secret's
    name, for its errors).
    """
    if directory is None:
        return {}
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"secret directory {directory} does not exist")
    files = {
        entry.name: entry
        for entry in sorted(root.iterdir())
        if not entry.name.startswith(".") and entry.is_file()
    }
    name = f"Secret {secret} (mounted at {directory})" if secret else f"Secret {directory}"
    return secret_text(name, {key: path.read_bytes for key, path in files.items()})


def secret_text(secret: str, data: Mapping[str, Callable[[], bytes]]) -> dict[str, str]:
    """A Secret's keys as text properties, each value read by its callable.

    The keys eop never uses (:data:`STRIMZI_UNUSED_KEYS`, e.g. Strimzi's binary
    PKCS#12 ``user.p12``) are left out unread; every other value must be UTF-8,
    else :class:`ConfigError` names the key and ``secret`` (a description such
    as ``"Secret kafka-user"``).  One trailing newline (as ``kubectl create secret
    --from-file`` keeps it) is dropped.
    """
    props: dict[str, str] = {}
    for key, read in data.items():
        if key in STRIMZI_UNUSED_KEYS:
            continue
        try:
            value = read().decode()
        except UnicodeDecodeError:
            raise ConfigError(
                f"key {key} of {secret} is not UTF-8 text: eop reads each key of a Kafka Secret "
                "as a client property (PEM for TLS material)"
            ) from None
        props[key] = value[:-1] if value.endswith("\n") else value
    return props


def _source_secret(config: RunConfig) -> dict[str, str]:
    ref = config.source.kafka.secret_ref
    return read_secret_dir(config.source_secret_dir, ref.name if ref else None)


def _sink_secret(config: RunConfig) -> dict[str, str]:
    ref = config.sink.kafka.secret_ref
    return read_secret_dir(config.sink_secret_dir, ref.name if ref else None)


#: Records per poll of Spark's Kafka reader: more than a 1 MB fetch holds (down to ~10 B each).
SOURCE_MAX_POLL_RECORDS = 100_000
#: How long the broker may hold a fetch of Spark's Kafka reader that finds no new records.
SOURCE_FETCH_MAX_WAIT_MS = 10


def refuse_owned(
    side: str, options: Mapping[str, str], secret: Mapping[str, str], owned: OwnedKeys
) -> None:
    """Raise ConfigError naming the first property of ``side`` (source, sink) that eop owns.

    The API server and the spec's models refuse them in options already; a run
    configuration not made from a spec could still hold one, and a Secret's keys are
    seen only here.
    """
    for where, props in ((f"{side}.kafka.options", options), (f"the {side}'s Secret", secret)):
        for key in props:
            if owned.owns(key):
                raise ConfigError(owned.refusal(key, where))


def spark_source_options(config: RunConfig) -> dict[str, str]:
    """Options of Spark's Kafka source, except ``startingOffsets`` (chosen by the runner)."""
    kafka = config.source.kafka
    secret = secret_client_properties(_source_secret(config))
    refuse_owned("source", kafka.options, secret, SOURCE_OPTIONS)
    options = {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "kafka.isolation.level": "read_committed",
        "failOnDataLoss": "true",
        "includeHeaders": "true",
        # Spark's Kafka reader asks the broker for the partition's earliest and latest offsets
        # (two ListOffsets round trips) after *every* poll; at the consumer's default of 500
        # records per poll that was ~1 core-second per million 100-byte records, JVM and
        # broker.  A poll now hands over whatever one partition fetch (1 MB) brought.
        # Overridable like any consumer setting (source.kafka.options).
        "kafka.max.poll.records": str(SOURCE_MAX_POLL_RECORDS),
        # A task reads a range it knows exists, but the consumer fetches ahead: once it
        # reaches the end of the partition (every batch of a pipeline that keeps up), the
        # broker holds that fetch for fetch.max.wait.ms (500 ms by default), and the
        # reader's next ListOffsets waits behind it on the same connection.  That was
        # ~0.4 s per task at the log end (measured: the last batch of a copy took twice as
        # long as the others).  Overridable like max.poll.records.
        "kafka.fetch.max.wait.ms": str(SOURCE_FETCH_MAX_WAIT_MS),
    }
    if kafka.topics is not None:
        options["subscribe"] = ",".join(kafka.topics)
    else:
        assert kafka.subscribed_pattern is not None  # the spec's one_of guarantees it
        options["subscribePattern"] = kafka.subscribed_pattern
    if kafka.max_offsets_per_trigger is not None:
        options["maxOffsetsPerTrigger"] = str(kafka.max_offsets_per_trigger)
    for key, value in java_client_properties({**kafka.options, **secret}).items():
        options[f"kafka.{key}"] = value
    return options


def source_client_config(config: RunConfig) -> dict[str, str]:
    """librdkafka settings for the source cluster (topic metadata), Java-only keys dropped."""
    return source_librdkafka_config(config.source.kafka, _source_secret(config))


def source_librdkafka_config(kafka: KafkaSource, secret: Mapping[str, str]) -> dict[str, str]:
    """librdkafka settings for the source cluster from the spec and the Secret's properties.

    The operator passes the Secret it read through the API, the runner the mounted one.
    """
    props = {**kafka.options, **secret_client_properties(secret)}
    props.pop("isolation.level", None)
    props.pop("enable.auto.commit", None)
    return librdkafka_compatible({"bootstrap.servers": kafka.bootstrap_servers, **props})


def sink_client_config(config: RunConfig) -> dict[str, str]:
    """librdkafka settings shared by every client on the sink cluster (where G lives)."""
    return without_java_only(sink_java_config(config))


def sink_librdkafka_config(kafka: KafkaSink, secret: Mapping[str, str]) -> dict[str, str]:
    """librdkafka settings for the sink cluster from the spec and the Secret's properties.

    Without the Java clients' own properties (``sasl.jaas.config``,
    ``ssl.truststore.*``...), which librdkafka refuses: the JVM writer gets
    them (:func:`sink_java_config`).
    """
    return without_java_only(_sink_properties(kafka, secret))


def sink_java_config(config: RunConfig) -> dict[str, str]:
    """Every sink client property, for the Java producer (see ``jvm_writer.java_settings``)."""
    kafka = config.sink.kafka
    return _sink_properties(kafka, _sink_secret(config))


def _sink_properties(kafka: KafkaSink, secret: Mapping[str, str]) -> dict[str, str]:
    refuse_owned("sink", kafka.options, secret, SINK_OPTIONS)
    return {
        "bootstrap.servers": kafka.bootstrap_servers,
        **kafka.options,
        **secret_client_properties(secret),
    }


#: Keys of a Strimzi ``KafkaUser`` Secret (TLS authentication) and librdkafka's PEM
#: property each one is.  ``ca.crt`` is also the key of Strimzi's cluster CA Secret.
STRIMZI_TLS_KEYS = {
    "ca.crt": "ssl.ca.pem",
    "user.crt": "ssl.certificate.pem",
    "user.key": "ssl.key.pem",
}
#: Keys of Strimzi's Secrets holding the same material as PKCS#12: not read.
STRIMZI_UNUSED_KEYS = ("user.p12", "user.password", "ca.p12", "ca.password")


def secret_client_properties(secret: Mapping[str, str]) -> dict[str, str]:
    """A Secret's keys as client properties (the runner's mounted Secret, the operator's read).

    Strimzi's file names (:data:`STRIMZI_TLS_KEYS`) become librdkafka's PEM
    properties (a property of that name in the Secret wins), the PKCS#12 copies
    are left out, and every other key is a property as it is.  The Java clients
    get the PEM material from :func:`java_client_properties`.
    """
    props = {key: value for key, value in secret.items() if key not in STRIMZI_UNUSED_KEYS}
    for key, name in STRIMZI_TLS_KEYS.items():
        value = props.pop(key, None)
        if value is not None:
            props.setdefault(name, value)
    return props


#: Every librdkafka client of the runner connects to the brokers as soon as metadata
#: names them. With sparse connections (librdkafka's default) a new client drops its
#: bootstrap connection once the metadata arrives, and the request it had sent there
#: waits for a reconnect timer: about one init_transactions in three waited 500 ms
#: (taking 5 ids over: 530 ms -> 80 ms), and the first read of G or of topic metadata by a
#: new client took 55-65 ms instead of 6-10 (measured on loopback). The clients talk to
#: most brokers anyway, and few at a time exist.
EAGER_CONNECTIONS: dict[str, bool] = {"enable.sparse.connections": False}


def producer_config(
    client: Mapping[str, str], transactional_id: str, transaction_timeout_ms: int
) -> dict[str, str | int | bool]:
    """A transactional producer's settings on top of the sink client settings."""
    conf: dict[str, str | int | bool] = {
        # Throughput defaults the user may override through sink options. Commits flush at
        # once, so a long linger delays nothing a read_committed reader sees; it fills 1 MB
        # batches (measured: ~0.7-1 core-s less broker CPU per 1M x 100 B than linger 20).
        "linger.ms": 200,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 500_000,
        # Send small requests (AddOffsetsToTxn, EndTxn...) at once, as Java clients do: with
        # Nagle's algorithm each transaction waited tens of ms on them (measured ~60 ms of
        # ~200 ms per partition and batch). Latency only; nothing about what is committed.
        "socket.nagle.disable": True,
        **EAGER_CONNECTIONS,
        # Keyed records land where Java producers (and Spark's Kafka sink) put them.
        "partitioner": "murmur2_random",
        **client,
        "transactional.id": transactional_id,
        "enable.idempotence": True,
        "transaction.timeout.ms": transaction_timeout_ms,
        # commit_transaction() reports failed deliveries: no per-record report is wanted.
        # confluent-kafka applies this in its own callback (librdkafka still hands every
        # acknowledged record to the thread that polls, which frees it); it keeps a
        # callback, should one be set, from running per record.
        "delivery.report.only.error": True,
    }
    return conf


#: The Java client's JAAS login module for each SASL mechanism librdkafka takes a user name
#: and password for.
_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


#: librdkafka's names of a SASL login that a ``sasl.jaas.config`` holds for the Java clients.
_LIBRDKAFKA_LOGIN = ("sasl.username", "sasl.password")


def _jaas_quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_client_properties(props: Mapping[str, str]) -> dict[str, str]:
    """``props`` for a Java Kafka client: librdkafka's SASL credentials given as JAAS.

    librdkafka takes ``sasl.username`` and ``sasl.password`` (and the mechanism
    as ``sasl.mechanism`` or ``sasl.mechanisms``); the Java client takes them in
    ``sasl.jaas.config``. For PLAIN and SCRAM, with no ``sasl.jaas.config``
    given, the JAAS line is built from them and they are left out, so one
    Secret serves the runner's librdkafka clients, Spark's Kafka source and the
    JVM writer alike. With a ``sasl.jaas.config`` given, that is the Java
    clients' login and librdkafka's user name and password are left out.
    librdkafka's TLS settings become the Java clients' PEM settings (see
    :func:`_java_tls`). Anything else passes as it is.
    """
    result = _java_tls(props)
    mechanism = result.get("sasl.mechanism", result.get("sasl.mechanisms", "GSSAPI"))
    mechanism = mechanism.strip().upper()
    if "sasl.jaas.config" in result:  # the user's own login for the Java clients
        for name in _LIBRDKAFKA_LOGIN:
            result.pop(name, None)
        return result
    module = _JAAS_MODULES.get(mechanism)
    if module is None or "sasl.username" not in result or "sasl.password" not in result:
        return result
    username, password = result.pop("sasl.username"), result.pop("sasl.password")
    result.pop("sasl.mechanisms", None)
    result["sasl.mechanism"] = mechanism
    result["sasl.jaas.config"] = (
        f"{module} required username={_jaas_quoted(username)} password={_jaas_quoted(password)};"
    )
    return result


#: The Java clients' settings that give them a trust store or a key store of their own.
_JAVA_TRUSTSTORE = ("ssl.truststore.location", "ssl.truststore.certificates")
_JAVA_KEYSTORE = ("ssl.keystore.location", "ssl.keystore.certificate.chain", "ssl.keystore.key")


def _java_tls(props: Mapping[str, str]) -> dict[str, str]:
    """``props`` with librdkafka's CA, certificate and key as the Java clients' PEM stores.

    ``ssl.ca.pem`` (or an ``ssl.ca.location`` file) becomes a PEM trust store,
    ``ssl.certificate.pem`` with ``ssl.key.pem`` a PEM key store, unless the
    Java settings are given too (they win).  librdkafka's names are left out
    then (the Java clients do not know them); an ``ssl.ca.location`` that is no
    file (a directory, ``probe``) stays, and the JVM writer leaves the tasks in
    Python.  ``ssl.endpoint.identification.algorithm``
    ``none`` (librdkafka) is the empty value for the Java clients.
    """
    result = dict(props)
    if any(name in result for name in _JAVA_TRUSTSTORE):  # the Java clients' own
        result.pop("ssl.ca.pem", None)
        result.pop("ssl.ca.location", None)
    else:
        ca_location = result.get("ssl.ca.location")
        if "ssl.ca.pem" in result:
            result["ssl.truststore.certificates"] = result.pop("ssl.ca.pem")
            result["ssl.truststore.type"] = "PEM"
        elif ca_location is not None and Path(ca_location).is_file():
            result["ssl.truststore.location"] = result.pop("ssl.ca.location")
            result["ssl.truststore.type"] = "PEM"
    pem = ("ssl.certificate.pem", "ssl.key.pem")
    if any(name in result for name in _JAVA_KEYSTORE):
        for name in pem:
            result.pop(name, None)
    elif all(name in result for name in pem):
        result["ssl.keystore.certificate.chain"] = result.pop("ssl.certificate.pem")
        result["ssl.keystore.key"] = result.pop("ssl.key.pem")
        result["ssl.keystore.type"] = "PEM"
    if result.get("ssl.endpoint.identification.algorithm", "").strip().lower() == "none":
        result["ssl.endpoint.identification.algorithm"] = ""
    return result


#: The Java-only property names a warning has named in this process.
_WARNED_JAVA_ONLY: set[str] = set()


def without_java_only(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` without the Java clients' own properties.

    Each name is given in a warning (never its value) once per process: the
    operator's lag check builds these settings at every check.
    """
    result = {k: v for k, v in conf.items() if not k.startswith(_JAVA_ONLY_PREFIXES)}
    for name in sorted(set(conf) - set(result) - _WARNED_JAVA_ONLY):
        _WARNED_JAVA_ONLY.add(name)
        log.warning("property %s is Java-only; librdkafka clients skip it", name)
    return result


def librdkafka_compatible(conf: Mapping[str, str]) -> dict[str, str]:
    """Drop the properties librdkafka does not know (Java-only ones shared with Spark).

    librdkafka rejects unknown properties at client creation, and the source
    Secret serves both the Java consumer and librdkafka, so unknown names are
    dropped with a warning naming the property (never its value).
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    result = without_java_only(conf)
    for _ in range(len(conf) + 1):
        try:
            AdminClient({**result, "log_level": 0})
            return result
        except KafkaException as exc:
            match = _UNKNOWN_PROPERTY.search(str(exc))
            if match is None or match.group(1) not in result:
                raise ConfigError(f"invalid Kafka client setting: {exc.args[0]}") from exc
            log.warning(
                "property %s is not a librdkafka property; runner clients skip it", match.group(1)
            )
            del result[match.group(1)]
    return result
