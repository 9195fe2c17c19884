"""TLS and mutual TLS to a real broker, with a Secret in Strimzi's ``KafkaUser`` shape.

The Secret holds ``ca.crt`` (and for mutual TLS ``user.crt``/``user.key``, and the
PKCS#12 copies eop does not read); the spec's options say ``security.protocol: SSL``.
Every client of the pipeline connects with it: the runner's librdkafka clients,
Spark's Kafka source and the JVM writer (as PEM stores), and the operator's lag check.
A CA that did not sign the cluster's certificate, or a client certificate that has
expired, ends the runner with one line naming the cause.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from devenv.certs import Certs, strimzi_user_secret
from devenv.kafka import CONSUMER_GROUPS_TOOL
from devenv.runners import Pipeline, produce
from eop_operator.api.load import load_pipeline
from eop_operator.health.progress import KafkaAccess, read_offsets
from eop_spark.kafka.client_config import sink_librdkafka_config, source_librdkafka_config
from tests.spark_apps.conftest import PipelineFactory
from tests.spark_apps.runs import assert_exactly_once

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 2000


def secret(directory: Path, keys: dict[str, str]) -> str:
    """A Secret as Kubernetes mounts it: one file per key."""
    directory.mkdir(parents=True)
    for name, value in keys.items():
        (directory / name).write_text(value)
    return str(directory)


def tls_config(
    pipeline: Pipeline, servers: str, source: dict[str, str], sink: dict[str, str]
) -> dict[str, Any]:
    """Source and sink through ``servers`` with TLS, each with its Secret; availableNow."""
    tls = {"security.protocol": "SSL"}
    return pipeline.config(
        source={
            "kafka": {
                "bootstrapServers": servers,
                "topics": [pipeline.source_topic],
                "options": tls,
            }
        },
        sink={"kafka": {"bootstrapServers": servers, "topic": pipeline.sink_topic, "options": tls}},
        trigger={"availableNow": True},
        sourceSecretDir=secret(pipeline.work / "source-secret", source),
        sinkSecretDir=secret(pipeline.work / "sink-secret", sink),
    )


def key_lines(certs: Certs, *names: str) -> list[str]:
    """The base64 lines of private keys: none may show in any output."""
    return [
        line
        for name in names
        for line in certs.text(f"{name}.key").splitlines()
        if line and not line.startswith("-----")
    ]


def lag_check(pipeline: Pipeline, servers: str, keys: dict[str, str]) -> dict[str, int | None]:
    """What the operator's lag check reads: committed - end per partition, Secret from the API."""
    spec = load_pipeline(
        {
            "apiVersion": "exactlyonce.io/v1alpha1",
            "kind": "ExactlyOncePipeline",
            "metadata": {"name": pipeline.name, "namespace": "test"},
            "spec": {
                "source": {
                    "kafka": {
                        "bootstrapServers": servers,
                        "topics": [pipeline.source_topic],
                        "options": {"security.protocol": "SSL"},
                        "secretRef": {"name": "kafka-user"},
                    }
                },
                "transform": {"sql": "SELECT key, value FROM source"},
                "sink": {
                    "kafka": {
                        "bootstrapServers": servers,
                        "topic": pipeline.sink_topic,
                        "options": {"security.protocol": "SSL"},
                        "secretRef": {"name": "kafka-user"},
                    }
                },
            },
        }
    )
    # As health.progress.kafka_access builds it from the Secret read through the API.
    access = KafkaAccess(
        source=source_librdkafka_config(spec.spec.source.kafka, keys),
        sink=sink_librdkafka_config(spec.spec.sink.kafka, keys),
    )
    return {
        f"{p.topic}-{p.partition}": None if p.committed is None else p.end - p.committed
        for p in read_offsets(access, spec, pipeline.group)
    }


@pytest.mark.parametrize("mutual", [False, True], ids=["tls-cluster-ca", "mtls-kafka-user"])
def test_exactly_once_through_tls_with_a_strimzi_secret(
    make_pipeline: PipelineFactory, kafka_tls_certs: Certs, mutual: bool
) -> None:
    pipeline = make_pipeline()
    broker = pipeline.broker
    produce(broker, pipeline.source_topic, ((f"k{i}", "v", i % 4) for i in range(RECORDS)))
    if mutual:  # a KafkaUser's Secret with the cluster's CA
        servers, keys = broker.mtls_bootstrap_servers, strimzi_user_secret(kafka_tls_certs)
    else:  # the cluster CA's Secret alone
        servers, keys = broker.tls_bootstrap_servers, {"ca.crt": kafka_tls_certs.text("ca.crt")}

    runner = pipeline.start(tls_config(pipeline, servers, keys, keys))

    assert runner.wait(300) == 0, runner.tail()
    assert_exactly_once(pipeline.output(), (f"k{i}" for i in range(RECORDS)))
    assert pipeline.progress() == pipeline.end_offsets()
    # The tasks wrote with the Java producer, which had only the PEM stores to connect with.
    messages = runner.messages()
    assert any("tasks commit in the executors' JVM" in m for m in messages), [
        m for m in messages if "librdkafka" in m or "tasks commit" in m
    ]
    logs = [p.read_text(errors="replace") for p in (pipeline.work / "logs").glob("runner-*")]
    secrets = key_lines(kafka_tls_certs, "user")
    assert len(logs) == 2 and not [line for line in secrets if any(line in t for t in logs)]
    # The operator's lag check reads G and the source through the same listener and Secret.
    lag = lag_check(pipeline, servers, keys)
    assert len(lag) == 4 and set(lag.values()) == {0}, lag
    if not mutual:  # once: Kafka's own lag tool sees input the pipeline has not read yet
        produce(broker, pipeline.source_topic, ((f"n{i}", "v", i % 4) for i in range(10)))
        assert consumer_groups_lag(pipeline, servers, kafka_tls_certs) == {
            (pipeline.source_topic, p): 10 // 4 + (p < 10 % 4) for p in range(4)
        }


def consumer_groups_lag(
    pipeline: Pipeline, servers: str, certs: Certs
) -> dict[tuple[str, int], int]:
    """The LAG column of ``kafka-consumer-groups --describe --group G`` over TLS, per partition."""
    command_config = pipeline.work / "tls-client.properties"
    command_config.write_text(
        "security.protocol=SSL\nssl.truststore.type=PEM\n"
        f"ssl.truststore.location={certs.path('ca.crt')}\n"
    )
    described = pipeline.broker.run_tool(
        CONSUMER_GROUPS_TOOL,
        *("--bootstrap-server", servers, "--command-config", str(command_config)),
        *("--describe", "--group", pipeline.group),
        check=True,
    )
    lines = [line.split() for line in described.stdout.splitlines() if line.strip()]
    header = lines[0]
    topic, partition, lag = (header.index(c) for c in ("TOPIC", "PARTITION", "LAG"))
    return {(row[topic], int(row[partition])): int(row[lag]) for row in lines[1:]}


@pytest.mark.parametrize(
    ("case", "cause"),
    [
        ("wrong-ca", "the sink kafka cluster's certificate is not signed by the ca in the sink"),
        ("expired", "the client certificate in the sink secret (user.crt or ssl.certificate.pem) "
         "has expired"),
    ],
    ids=["wrong-ca", "expired-client-certificate"],
)  # fmt: skip
def test_a_certificate_problem_ends_the_runner_with_one_line_naming_it(
    make_pipeline: PipelineFactory, kafka_tls_certs: Certs, case: str, cause: str
) -> None:
    pipeline = make_pipeline()
    produce(pipeline.broker, pipeline.source_topic, ((f"k{i}", "v", i % 4) for i in range(100)))
    good = strimzi_user_secret(kafka_tls_certs)
    if case == "wrong-ca":  # a CA that did not sign the cluster's certificate
        bad = strimzi_user_secret(kafka_tls_certs, ca="other-ca")
    else:  # signed by the cluster's CA, but expired
        bad = strimzi_user_secret(kafka_tls_certs, user="expired")

    started = time.monotonic()
    runner = pipeline.start(tls_config(pipeline, pipeline.broker.mtls_bootstrap_servers, good, bad))

    assert runner.wait(240) != 0, runner.tail()
    assert time.monotonic() - started < 60
    lines = runner.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("eop: error: "), runner.tail()
    assert cause in lines[0].lower(), lines[0]
    output = runner.stderr + "".join(
        p.read_text(errors="replace") for p in (pipeline.work / "logs").glob("runner-*")
    )
    secrets = key_lines(kafka_tls_certs, "user", "expired")
    assert not [line for line in secrets if line in output]
    assert pipeline.output() == []
