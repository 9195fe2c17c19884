"""Kafka client settings: spec options, mounted Secrets, and what the runner owns."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from devenv.certs import VALID_DAYS, Certs, strimzi_user_secret_data
from eop_spark.contract.errors import ConfigError
from eop_spark.contract.run_config import RunConfig
from eop_spark.exactly_once.progress_group import consumer_config
from eop_spark.kafka.client_config import (
    SOURCE_FETCH_MAX_WAIT_MS,
    SOURCE_MAX_POLL_RECORDS,
    java_client_properties,
    librdkafka_compatible,
    producer_config,
    read_secret_dir,
    secret_client_properties,
    sink_client_config,
    sink_java_config,
    sink_librdkafka_config,
    source_client_config,
    source_librdkafka_config,
    spark_source_options,
    without_java_only,
)
from eop_spark.kafka.preflight import certificate_not_after


def make_config(**overrides: Any) -> RunConfig:
    data: dict[str, Any] = {
        "pipeline": "ns.p",
        "source": {"kafka": {"bootstrapServers": "127.0.0.1:9", "topics": ["a", "b"]}},
        "transform": {"sql": "SELECT value FROM source"},
        "sink": {"kafka": {"bootstrapServers": "127.0.0.1:8", "topic": "out"}},
        "transactionalIdPrefix": "eop.ns.p",
        "progressGroup": "eop.ns.p",
        "checkpointRoot": "/tmp/ck",
    }
    data.update(overrides)
    return RunConfig.model_validate(data)


def secret_dir(root: Path, **props: str | bytes) -> Path:
    root.mkdir()
    for name, value in props.items():
        (root / name).write_bytes(value if isinstance(value, bytes) else value.encode())
    # What a Kubernetes Secret mount also contains.
    (root / "..data").mkdir()
    (root / "..data" / "ignored").write_text("x")
    return root


def test_secret_dir_is_one_property_per_file(tmp_path: Path) -> None:
    root = secret_dir(tmp_path / "s", **{"sasl.username": "u\n", "sasl.password": "p"})
    assert read_secret_dir(str(root)) == {"sasl.username": "u", "sasl.password": "p"}
    assert read_secret_dir(None) == {}
    with pytest.raises(ConfigError):
        read_secret_dir(str(tmp_path / "missing"))


def test_spark_source_options(tmp_path: Path) -> None:
    root = secret_dir(tmp_path / "s", **{"sasl.mechanism": "PLAIN"})
    config = make_config(
        source={
            "kafka": {
                "bootstrapServers": "h:1",
                "topicPattern": "ev.*",
                "maxOffsetsPerTrigger": 10,
                "options": {"fetch.min.bytes": "1"},
            }
        },
        sourceSecretDir=str(root),
    )
    options = spark_source_options(config)
    # Internal topics (names starting with __) never match.
    assert options["subscribePattern"] == "^(?!__)(?:ev.*)$" and "subscribe" not in options
    assert options["kafka.isolation.level"] == "read_committed"
    assert options["failOnDataLoss"] == "true"
    assert options["maxOffsetsPerTrigger"] == "10"
    assert options["kafka.fetch.min.bytes"] == "1"
    assert options["kafka.sasl.mechanism"] == "PLAIN"
    assert spark_source_options(make_config())["subscribe"] == "a,b"


def test_librdkafka_credentials_become_the_java_clients_jaas_line() -> None:
    plain = {"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": 'p"w\\'}
    java = java_client_properties({"security.protocol": "SASL_SSL", **plain})
    assert java == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        # Quotes and backslashes escaped as the JAAS parser reads them.
        "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="u" password="p\\"w\\\\";',
    }
    # librdkafka's plural alias, and SCRAM.
    scram = java_client_properties(
        {"sasl.mechanisms": "scram-sha-512", "sasl.username": "u", "sasl.password": "p"}
    )
    assert scram["sasl.mechanism"] == "SCRAM-SHA-512" and "sasl.mechanisms" not in scram
    assert scram["sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.scram.ScramLoginModule required"
    )
    # Another mechanism, or half the credentials: as given.
    kerberos = {**plain, "sasl.mechanism": "GSSAPI"}
    for unchanged in (kerberos, {"sasl.username": "u"}):
        assert java_client_properties(unchanged) == unchanged
    # A JAAS line of the user's own is the Java clients' login; librdkafka's is left out.
    own = java_client_properties({**plain, "sasl.jaas.config": "mine"})
    assert own == {"sasl.mechanism": "PLAIN", "sasl.jaas.config": "mine"}


def test_spark_source_gets_the_secret_credentials_as_jaas(tmp_path: Path) -> None:
    properties = {"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}
    root = secret_dir(tmp_path / "s", **properties)
    options = spark_source_options(make_config(sourceSecretDir=str(root)))
    assert "kafka.sasl.username" not in options and "kafka.sasl.password" not in options
    assert 'username="u" password="p"' in options["kafka.sasl.jaas.config"]


def test_a_skipped_java_only_property_is_named_once_never_valued(
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = f"ssl.truststore.test-{id(caplog)}"  # not named by an earlier test
    with caplog.at_level("WARNING", logger="eop_spark.kafka.client_config"):
        for _ in range(3):  # e.g. the operator's lag check, every interval
            assert without_java_only({"a": "1", name: "s3cr3t"}) == {"a": "1"}
    named = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(named) == 1 and "s3cr3t" not in caplog.text


def with_source_options(**options: str) -> RunConfig:
    """A config whose one-topic source has these consumer ``options``."""
    return make_config(
        source={"kafka": {"bootstrapServers": "h:1", "topics": ["a"], "options": options}}
    )


def test_source_polls_a_whole_fetch_unless_the_user_says_otherwise() -> None:
    default = spark_source_options(make_config())["kafka.max.poll.records"]
    assert default == str(SOURCE_MAX_POLL_RECORDS)
    mine = with_source_options(**{"max.poll.records": "500"})
    assert spark_source_options(mine)["kafka.max.poll.records"] == "500"


def test_source_fetches_at_the_log_end_come_back_at_once_unless_the_user_says_otherwise() -> None:
    default = spark_source_options(make_config())["kafka.fetch.max.wait.ms"]
    assert int(default) == SOURCE_FETCH_MAX_WAIT_MS < 100
    mine = with_source_options(**{"fetch.max.wait.ms": "500"})
    assert spark_source_options(mine)["kafka.fetch.max.wait.ms"] == "500"


def _options_not_made_from_a_spec(config: RunConfig, side: str, **options: str) -> RunConfig:
    """``config`` with client options the spec's models would refuse (no validation)."""
    spec = getattr(config, side)
    kafka = spec.kafka.model_copy(update={"options": options})
    return config.model_copy(update={side: spec.model_copy(update={"kafka": kafka})})


@pytest.mark.parametrize("key", ["isolation.level", "kafka.isolation.level", "group.id"])
def test_source_settings_eop_owns_are_refused_by_the_runner_too(key: str) -> None:
    config = _options_not_made_from_a_spec(make_config(), "source", **{key: "read_uncommitted"})
    with pytest.raises(
        ConfigError, match=rf"source\.kafka\.options: {re.escape(key)} is set by eop"
    ):
        spark_source_options(config)


@pytest.mark.parametrize("key", ["acks", "transactional.id", "Enable.Idempotence"])
def test_sink_settings_eop_owns_are_refused_in_options_and_in_the_secret(
    tmp_path: Path, key: str
) -> None:
    config = _options_not_made_from_a_spec(make_config(), "sink", **{key: "1"})
    with pytest.raises(ConfigError, match=rf"sink\.kafka\.options: {re.escape(key)} is set by eop"):
        sink_client_config(config)
    root = secret_dir(tmp_path / "s", **{key: "1"})
    with pytest.raises(ConfigError, match=rf"the sink's Secret: {re.escape(key)} is set by eop"):
        sink_client_config(make_config(sinkSecretDir=str(root)))


def test_sink_options_and_secrets_merge_but_transactional_settings_are_owned(
    tmp_path: Path,
) -> None:
    root = secret_dir(tmp_path / "s", **{"sasl.password": "secret"})
    config = make_config(
        sink={
            "kafka": {
                "bootstrapServers": "h:2",
                "topic": "o",
                "options": {"compression.type": "lz4"},
            }
        },
        sinkSecretDir=str(root),
    )
    assert sink_client_config(config) == {
        "bootstrap.servers": "h:2",
        "compression.type": "lz4",
        "sasl.password": "secret",
    }
    # The Java clients' own properties go to the JVM writer only: librdkafka refuses them.
    java_only = secret_dir(tmp_path / "j", **{"sasl.jaas.config": "x", "sasl.password": "p"})
    with_jaas = make_config(
        sink={"kafka": {"bootstrapServers": "h:2", "topic": "o"}}, sinkSecretDir=str(java_only)
    )
    assert "sasl.jaas.config" not in sink_client_config(with_jaas)
    assert sink_java_config(with_jaas)["sasl.jaas.config"] == "x"


def test_producer_config() -> None:
    conf = producer_config({"bootstrap.servers": "h:2", "linger.ms": "1"}, "eop.p.t.0", 90_000)
    assert conf["transactional.id"] == "eop.p.t.0"
    assert conf["transaction.timeout.ms"] == 90_000
    assert conf["enable.idempotence"] is True
    assert conf["linger.ms"] == "1"  # the user's option wins over the runner's default


@pytest.mark.parametrize(
    "build",
    [
        lambda client: producer_config(client, "eop.p.t.0", 90_000),
        lambda client: consumer_config("eop.ns.p", client),
    ],
    ids=["producer", "progress-group"],
)
def test_runner_clients_connect_eagerly_unless_the_sink_options_say_otherwise(build: Any) -> None:
    # Sparse connections made a new client's first request wait ~50-500 ms on a reconnect timer.
    assert build({"bootstrap.servers": "h:2"})["enable.sparse.connections"] is False
    chosen = build({"bootstrap.servers": "h:2", "enable.sparse.connections": "true"})
    assert chosen["enable.sparse.connections"] == "true"


def test_the_progress_group_reader_reads_stable_offsets_and_never_commits() -> None:
    conf = consumer_config("eop.ns.p", {"bootstrap.servers": "h:2", "isolation.level": "x"})
    assert conf["group.id"] == "eop.ns.p"
    assert conf["isolation.level"] == "read_committed"
    assert conf["enable.auto.commit"] is False


def test_java_only_properties_are_dropped_for_librdkafka() -> None:
    conf = {"bootstrap.servers": "127.0.0.1:9", "ssl.truststore.location": "/x", "client.id": "c"}
    assert librdkafka_compatible(conf) == {"bootstrap.servers": "127.0.0.1:9", "client.id": "c"}
    assert source_client_config(make_config())["bootstrap.servers"] == "127.0.0.1:9"


#: A Secret as Strimzi writes it for a KafkaUser with TLS authentication.
STRIMZI_USER = {
    "ca.crt": "-----CA-----",
    "user.crt": "-----CERT-----",
    "user.key": "-----KEY-----",
    "user.p12": "pkcs12",
    "user.password": "p12-password",
}


def test_a_strimzi_user_secret_is_the_tls_material_of_every_client(tmp_path: Path) -> None:
    assert secret_client_properties(STRIMZI_USER) == {
        "ssl.ca.pem": "-----CA-----",
        "ssl.certificate.pem": "-----CERT-----",
        "ssl.key.pem": "-----KEY-----",
    }
    # librdkafka: the runner's clients, through the mounted Secret...
    root = secret_dir(tmp_path / "s", **STRIMZI_USER)
    config = make_config(
        sourceSecretDir=str(root),
        sinkSecretDir=str(root),
        sink={
            "kafka": {
                "bootstrapServers": "127.0.0.1:8",
                "topic": "out",
                "options": {"security.protocol": "SSL"},
            }
        },
    )
    sink = sink_client_config(config)
    assert sink["security.protocol"] == "SSL" and sink["ssl.key.pem"] == "-----KEY-----"
    assert not any(key.startswith(("user.", "ca.")) for key in sink)
    # ... and the operator's lag check, through the Secret it read from the API.
    assert sink_librdkafka_config(config.sink.kafka, STRIMZI_USER) == sink
    source = source_librdkafka_config(config.source.kafka, STRIMZI_USER)
    assert source["ssl.ca.pem"] == "-----CA-----" and "user.p12" not in source
    # Java: Spark's source and the JVM writer get PEM stores.
    java = {
        "ssl.truststore.type": "PEM",
        "ssl.truststore.certificates": "-----CA-----",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": "-----CERT-----",
        "ssl.keystore.key": "-----KEY-----",
    }
    assert java_client_properties(sink_java_config(config)) == {
        "bootstrap.servers": "127.0.0.1:8",
        "security.protocol": "SSL",
        **java,
    }
    options = spark_source_options(config)
    assert {k: options[f"kafka.{k}"] for k in java} == java
    assert not any(k.startswith(("kafka.ssl.ca.", "kafka.ssl.key.pem")) for k in options)


def test_a_strimzi_secret_with_its_binary_pkcs12_mounts_as_tls_material(
    tmp_path: Path, kafka_tls_certs: Certs
) -> None:
    certs = kafka_tls_certs
    data = strimzi_user_secret_data(certs)
    data["ca.p12"] = data["user.p12"]  # Strimzi's cluster CA Secret holds one too
    root = secret_dir(tmp_path / "s", **data)
    config = make_config(
        sinkSecretDir=str(root),
        sink={
            "kafka": {
                "bootstrapServers": "127.0.0.1:8",
                "topic": "out",
                "secretRef": {"name": "kafka-user"},
                "options": {"security.protocol": "SSL"},
            }
        },
    )
    sink = sink_client_config(config)
    pem = {name: certs.text(name).removesuffix("\n") for name in ("ca.crt", "user.crt", "user.key")}
    assert sink["ssl.key.pem"] == pem["user.key"]
    assert sink["ssl.certificate.pem"] == pem["user.crt"]
    assert sink["ssl.ca.pem"] == pem["ca.crt"]
    assert not any(key.endswith((".p12", ".password")) for key in sink)
    assert java_client_properties(sink_java_config(config))["ssl.keystore.key"] == pem["user.key"]


def test_a_binary_value_eop_needs_is_an_error_naming_key_and_secret(
    tmp_path: Path, kafka_tls_certs: Certs
) -> None:
    certs = kafka_tls_certs
    # A key eop reads (user.key) holding binary DER instead of PEM.
    root = secret_dir(tmp_path / "s", **{"user.key": strimzi_user_secret_data(certs)["user.p12"]})
    sink = {"bootstrapServers": "h:1", "topic": "out", "secretRef": {"name": "kafka-user"}}
    config = make_config(sinkSecretDir=str(root), sink={"kafka": sink})
    with pytest.raises(ConfigError, match=r"key user\.key of Secret kafka-user .*not UTF-8"):
        sink_client_config(config)


def test_librdkafka_tls_settings_become_the_java_clients_pem_stores(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----CA-----")
    # A CA file (the issue: partitioned tasks used to fall back to Python for it).
    assert java_client_properties({"ssl.ca.location": str(ca)}) == {
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(ca),
    }
    # A CA directory or librdkafka's "probe" has no Java equivalent: kept as it is.
    for location in (str(tmp_path), "probe"):
        assert java_client_properties({"ssl.ca.location": location}) == {
            "ssl.ca.location": location
        }
    # A certificate without its key is no key store.
    half = {"ssl.certificate.pem": "-----CERT-----"}
    assert java_client_properties(half) == half
    # The Java clients' own stores win; librdkafka's names are then left out.
    own = {"ssl.truststore.location": "/t.p12", "ssl.keystore.location": "/k.p12"}
    assert java_client_properties({**own, **secret_client_properties(STRIMZI_USER)}) == own
    # librdkafka's "none" is the Java clients' empty algorithm (no host name check).
    none = java_client_properties({"ssl.endpoint.identification.algorithm": "none"})
    assert none == {"ssl.endpoint.identification.algorithm": ""}


def test_a_client_certificates_expiry_is_read_from_its_pem(kafka_tls_certs: Certs) -> None:
    """What names an expired client certificate in the runner's failure line."""
    certs = kafka_tls_certs
    now = datetime.now(UTC)
    valid = certificate_not_after(certs.text("user.crt"))
    expired = certificate_not_after(certs.text("expired.crt"))
    assert valid is not None and valid - now > timedelta(days=VALID_DAYS - 1)
    assert expired is not None and timedelta(0) < now - expired < timedelta(days=2)
    # The first certificate of a chain counts; anything else is unreadable.
    chain = certs.text("expired.crt") + certs.text("ca.crt")
    assert certificate_not_after(chain) == expired
    assert certificate_not_after(certs.text("user.key")) is None
    assert certificate_not_after("-----BEGIN CERTIFICATE-----AAAA-----END CERTIFICATE-----") is None
