"""Source and sink on different Kafka clusters, exactly once (invariant 9).

The source topic is on the session broker, the sink topic and G on another cluster
(``other_cluster_broker``), which also has a topic of the source topic's name with one
partition: G must keep its offsets under its progress topics there, never under that
topic. The chaos scenarios of ``test_chaos.py`` run across the two clusters (the
partitioned one with a new checkpoint generation every second runner, as after a lost
checkpoint); then G, read on the sink cluster, equals the source end offsets, and so does
the lag view the broker's own ``kafka-consumer-groups`` shows on the source cluster
(those two are ``slow``). The progress topics follow partitions and topics added while a
pipeline runs; an offset lost from one stops a new generation (exit 5); a sink login that
may not create them stops the runner with one line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devenv.kafka import CONSUMER_GROUPS_TOOL, KafkaBroker
from devenv.runners import Pipeline, committed_offsets, produce
from eop_spark.contract.errors import EXIT_PROGRESS_MISSING
from tests.plugins.kafka import consumer_groups_describe
from tests.spark_apps import chaos
from tests.spark_apps.conftest import PipelineFactory
from tests.spark_apps.kafka.test_sasl import secret
from tests.spark_apps.runs import assert_exactly_once

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

KILLS = 4
#: Offsets per batch.
PER_BATCH = 2_000


def across_clusters(make_pipeline: PipelineFactory, other: KafkaBroker) -> Pipeline:
    """A pipeline from the session broker to ``other``, which has a topic named like the source."""
    pipeline = make_pipeline(sink_broker=other)
    other.create_topic(pipeline.source_topic, 1)  # the same name, fewer partitions
    return pipeline


def assert_nothing_under_the_source_name(pipeline: Pipeline) -> None:
    """G has no offset for the sink cluster's own topic of the source topic's name."""
    assert pipeline.sink_broker is not None
    same_name = [(pipeline.source_topic, 0)]
    assert committed_offsets(pipeline.sink_broker, pipeline.group, same_name) == {}


def assert_lag_view_on_source(pipeline: Pipeline) -> None:
    """``kafka-consumer-groups --describe`` on the source cluster: G at the end, no lag."""
    described = consumer_groups_describe(pipeline.broker, pipeline.group)
    assert {tp: row["committed"] for tp, row in described.items()} == pipeline.end_offsets()
    assert all(row["lag"] == 0 for row in described.values())


@pytest.mark.slow
def test_partitioned_filter_across_clusters_survives_kill_9_and_lost_checkpoints(
    make_pipeline: PipelineFactory, other_cluster_broker: KafkaBroker
) -> None:
    pipeline = across_clusters(make_pipeline, other_cluster_broker)

    runners = chaos.partitioned_filter(
        pipeline,
        chaos.seeded(),
        kills=KILLS,
        per_batch=PER_BATCH,
        generation=lambda k: k // 2,  # every second runner starts a new generation from G
    )

    resumed = [m for r in runners for m in r.messages() if "resume from progress group" in m]
    assert any("4 of 4 partitions resume" in m for m in resumed), resumed
    assert all(f"{pipeline.group}.progress.<source topic>" in m for m in resumed)
    assert_nothing_under_the_source_name(pipeline)
    assert_lag_view_on_source(pipeline)


@pytest.mark.slow
def test_coordinated_window_counts_across_clusters_survive_kill_9(
    make_pipeline: PipelineFactory, other_cluster_broker: KafkaBroker
) -> None:
    pipeline = across_clusters(make_pipeline, other_cluster_broker)

    chaos.window_counts(pipeline, chaos.seeded(), kills=KILLS, per_batch=PER_BATCH)

    assert_nothing_under_the_source_name(pipeline)
    assert pipeline.lag_view() == pipeline.end_offsets()


def test_progress_lost_on_the_sink_cluster_stops_a_new_generation(
    make_pipeline: PipelineFactory, other_cluster_broker: KafkaBroker
) -> None:
    """Invariant 7 across clusters: G's offset deleted from its progress topic -> exit 5."""
    pipeline = make_pipeline(
        source_partitions=2, sink_partitions=1, sink_broker=other_cluster_broker
    )
    produce(pipeline.broker, pipeline.source_topic, ((f"k{i}", "v", i % 2) for i in range(60)))
    config = pipeline.config(trigger={"availableNow": True})
    first = pipeline.start(config, generation=0)
    assert first.wait(240) == 0, first.tail()
    assert pipeline.caught_up()

    progress_topic = f"{pipeline.group}.progress.{pipeline.source_topic}"
    other_cluster_broker.run_tool(
        CONSUMER_GROUPS_TOOL,
        *("--bootstrap-server", other_cluster_broker.bootstrap_servers, "--delete-offsets"),
        *("--group", pipeline.group, "--topic", f"{progress_topic}:1"),
        check=True,
    )
    refused = pipeline.start(config, generation=1)

    assert refused.wait(240) == EXIT_PROGRESS_MISSING, refused.tail()
    (line,) = [x for x in refused.stderr.splitlines() if x.startswith("eop: error:")]
    assert f"has no committed offset for {pipeline.source_topic}-1, which gen-0" in line
    assert f"under progress topics {pipeline.group}.progress.<source topic>" in line
    assert_exactly_once(pipeline.output(), (f"k{i}" for i in range(60)))


@pytest.mark.parametrize("tasks", ["jvm", "python"])
def test_progress_topics_grow_with_the_source_while_running(
    make_pipeline: PipelineFactory, other_cluster_broker: KafkaBroker, tasks: str
) -> None:
    """Partitions added to a source topic, and a new topic a pattern matches: G keeps up."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewPartitions

    pipeline = make_pipeline(source_partitions=2, sink_broker=other_cluster_broker)
    first, second = pipeline.source_topic, f"{pipeline.source_topic}-b"
    produce(pipeline.broker, first, ((f"a{i}", "v", i % 2) for i in range(40)))
    source = {
        "kafka": {
            "bootstrapServers": pipeline.broker.bootstrap_servers,
            "topicPattern": f"{re.escape(first)}(-b)?",
            "options": {"metadata.max.age.ms": "1000"},  # Spark's source sees new topics soon
        }
    }
    env = {"EOP_NO_JVM_WRITER": "1"} if tasks == "python" else {}
    runner = pipeline.start(pipeline.config(source=source), env=env)
    runner.wait_for("the first topic copied", pipeline.caught_up, 240)

    admin = AdminClient(pipeline.broker.client_config())
    admin.create_partitions([NewPartitions(first, 3)])[first].result(timeout=30)
    pipeline.broker.create_topic(second, 2)
    produce(pipeline.broker, first, ((f"b{i}", "v", 2) for i in range(10)))
    produce(pipeline.broker, second, ((f"c{i}", "v", i % 2) for i in range(10)))
    both = {**pipeline.end_offsets(first), **pipeline.end_offsets(second)}
    runner.wait_for("both topics copied", lambda: pipeline.progress(first, second) == both, 240)
    runner.terminate()
    assert runner.wait(180) == 0, runner.tail()

    expected = [f"a{i}" for i in range(40)] + [f"{k}{i}" for k in "bc" for i in range(10)]
    assert_exactly_once(pipeline.output(), expected)
    assert pipeline.lag_view(first, second) == both  # the view on the source cluster followed
    metadata = AdminClient(other_cluster_broker.client_config()).list_topics(timeout=30).topics
    assert len(metadata[f"{pipeline.group}.progress.{first}"].partitions) == 3
    assert len(metadata[f"{pipeline.group}.progress.{second}"].partitions) == 2
    where = "the executors' JVM" if tasks == "jvm" else "Python workers"
    assert any(f"tasks commit in {where}" in m for m in runner.messages())


def add_acls(broker: KafkaBroker, user: str, *acls: tuple[str, str, str, str, str]) -> None:
    """ACLs for ``user``: (permission, operation, resource type, resource name, pattern type)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    bindings = [
        AclBinding(
            ResourceType[kind],
            name,
            ResourcePatternType[pattern],
            f"User:{user}",
            "*",
            AclOperation[operation],
            AclPermissionType[permission],
        )
        for permission, operation, kind, name, pattern in acls
    ]
    admin = AdminClient(broker.client_config())  # kept until the futures are done
    for future in admin.create_acls(bindings).values():
        future.result(timeout=30)


def test_sink_credentials_that_may_not_create_progress_topics_stop_before_any_output(
    make_pipeline: PipelineFactory, other_cluster_broker: KafkaBroker, tmp_path: Path
) -> None:
    pipeline = make_pipeline(sink_broker=other_cluster_broker)
    produce(pipeline.broker, pipeline.source_topic, ((f"k{i}", "v", i % 4) for i in range(100)))
    ((user, password),) = other_cluster_broker.sasl_plain_users.items()
    progress_topic = f"{pipeline.group}.progress.{pipeline.source_topic}"
    # It may see the progress topics but not create them (nor any topic: no CREATE on the
    # cluster; where a resource has an ACL, the broker's allow-everyone default ends).
    add_acls(
        other_cluster_broker,
        user,
        ("DENY", "CREATE", "BROKER", "kafka-cluster", "LITERAL"),
        ("ALLOW", "DESCRIBE", "TOPIC", f"{pipeline.group}.progress.", "PREFIXED"),
    )
    servers = other_cluster_broker.sasl_bootstrap_servers
    config = pipeline.config(
        sink={"kafka": {"bootstrapServers": servers, "topic": pipeline.sink_topic}},
        sinkSecretDir=secret(tmp_path / "sink-secret", password, user),
        trigger={"availableNow": True},
    )

    runner = pipeline.start(config)

    assert runner.wait(120) == 3, runner.tail()  # the environment's to fix
    (line,) = runner.stderr.strip().splitlines()
    assert line.startswith(
        f"eop: error: [EnvironmentNotReady] the sink credentials may not create progress topic "
        f"{progress_topic} on {servers}"
    ), line
    assert f"grant CREATE on topic {progress_topic}" in line
    assert pipeline.output() == []
    assert pipeline.progress() == {}
