"""Credentials from a Secret on a real broker that asks for them (SASL/PLAIN).

A Secret with librdkafka's names only (``sasl.username``, ``sasl.password``)
serves every client: the runner's librdkafka clients take them as they are,
Spark's Kafka source and the JVM writer get them as the Java client's
``sasl.jaas.config``. One that also holds a ``sasl.jaas.config`` gives the Java
clients that line, and librdkafka clients never see it (they refuse it).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from devenv.runners import Pipeline, produce
from tests.spark_apps.conftest import PipelineFactory
from tests.spark_apps.runs import assert_exactly_once

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 2000


def secret(directory: Path, password: str, user: str, *, jaas: bool = False) -> str:
    """A Secret as Kubernetes mounts it: one file per client property.

    librdkafka's names; with ``jaas`` also the Java clients' own login line.
    """
    directory.mkdir(parents=True)
    properties = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": password,
    }
    if jaas:
        properties["sasl.jaas.config"] = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{user}" password="{password}";'
        )
    for name, value in properties.items():
        (directory / name).write_text(value + "\n")
    return str(directory)


def sasl_config(pipeline: Pipeline, password: str, *, jaas: bool = False) -> dict[str, Any]:
    """Source and sink through the SASL listener, each with its Secret; availableNow."""
    ((user, _),) = pipeline.broker.sasl_plain_users.items()
    servers = pipeline.broker.sasl_bootstrap_servers
    return pipeline.config(
        source={"kafka": {"bootstrapServers": servers, "topics": [pipeline.source_topic]}},
        sink={"kafka": {"bootstrapServers": servers, "topic": pipeline.sink_topic}},
        trigger={"availableNow": True},
        sourceSecretDir=secret(pipeline.work / "source-secret", password, user, jaas=jaas),
        sinkSecretDir=secret(pipeline.work / "sink-secret", password, user, jaas=jaas),
    )


@pytest.mark.parametrize("jaas", [False, True], ids=["librdkafka-names", "with-java-jaas"])
def test_secret_credentials_serve_every_client_and_never_show(
    make_pipeline: PipelineFactory, jaas: bool
) -> None:
    pipeline = make_pipeline()
    produce(pipeline.broker, pipeline.source_topic, ((f"k{i}", "v", i % 4) for i in range(RECORDS)))
    ((_, password),) = pipeline.broker.sasl_plain_users.items()

    runner = pipeline.start(sasl_config(pipeline, password, jaas=jaas))

    assert runner.wait(300) == 0, runner.tail()
    assert_exactly_once(pipeline.output(), (f"k{i}" for i in range(RECORDS)))
    assert pipeline.progress() == pipeline.end_offsets()
    # The tasks wrote with the Java producer, which had only the JAAS line to log in with.
    assert any("tasks commit in the executors' JVM" in m for m in runner.messages())
    # Its stdout and stderr (JSON log lines, Spark's and the Java clients' logs).
    logs = [p.read_text(errors="replace") for p in (pipeline.work / "logs").glob("runner-*")]
    assert len(logs) == 2 and all(password not in text for text in logs)


def test_a_wrong_password_fails_fast_with_one_line_and_writes_nothing(
    make_pipeline: PipelineFactory,
) -> None:
    pipeline = make_pipeline()
    produce(pipeline.broker, pipeline.source_topic, ((f"k{i}", "v", i % 4) for i in range(100)))
    wrong = "not-the-password"

    started = time.monotonic()
    runner = pipeline.start(sasl_config(pipeline, wrong))

    assert runner.wait(240) != 0, runner.tail()
    assert time.monotonic() - started < 60
    lines = runner.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("eop: error: "), runner.tail()
    assert "authentication" in lines[0].lower(), lines[0]
    assert wrong not in runner.stderr
    assert pipeline.output() == []
