"""Where the progress group keeps its offsets: the names, the choice by cluster id (pure)."""

from __future__ import annotations

import re

import pytest

from eop_spark.contract.errors import EnvironmentNotReady
from eop_spark.contract.progress_names import (
    MAX_TOPIC_NAME,
    ProgressNames,
    name_clash,
    progress_names,
    progress_topic,
)

#: What Kafka accepts as a topic name.
LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def test_a_progress_topic_is_named_after_the_group_and_the_source_topic() -> None:
    assert progress_topic("eop.shop.orders", "orders.v1") == "eop.shop.orders.progress.orders.v1"


def test_a_name_too_long_for_kafka_ends_in_a_hash_of_the_whole() -> None:
    group = "eop.a-namespace-of-sixty-three-characters-aaaaaaaaaaaaaaaaaaaaaaa.orders"
    first, second = "t" * 200 + "-first", "t" * 200 + "-second"

    names = [progress_topic(group, first), progress_topic(group, second)]

    assert all(len(n) == MAX_TOPIC_NAME and LEGAL_TOPIC.fullmatch(n) for n in names)
    assert names[0] != names[1]  # the same first 232 characters, told apart by the hash
    assert all(n.startswith(f"{group}.progress.tttt") for n in names)
    assert re.fullmatch(r".*\.[0-9a-f]{16}", names[0])
    # The same pair always gives the same name (every run, the operator, the JVM writer's map).
    assert progress_topic(group, first) == names[0]
    assert progress_topic(group + "x", first) != names[0]


def test_the_longest_name_that_fits_is_spelled_out() -> None:
    group = "eop.ns.p"
    topic = "t" * (MAX_TOPIC_NAME - len("eop.ns.p.progress."))
    assert progress_topic(group, topic) == f"eop.ns.p.progress.{topic}"
    assert progress_topic(group, topic + "t") != f"eop.ns.p.progress.{topic}t"


def test_one_cluster_keeps_the_source_names() -> None:
    names = progress_names("eop.ns.p", "cluster-a", "cluster-a")
    assert names == ProgressNames("eop.ns.p", progress_topics=False)
    assert names.stored({("events", 3): 10}) == {("events", 3): 10}
    assert names.topic_map(["events"]) is None
    assert names.where() == "progress group eop.ns.p"


def test_two_clusters_use_progress_topics_both_ways() -> None:
    names = progress_names("eop.ns.p", "cluster-a", "cluster-b")
    assert names.progress_topics
    assert names.stored({("events", 3): 10, ("clicks", 0): 1}) == {
        ("eop.ns.p.progress.events", 3): 10,
        ("eop.ns.p.progress.clicks", 0): 1,
    }
    assert names.sources([("events", 3)]) == {("eop.ns.p.progress.events", 3): ("events", 3)}
    assert names.topic_map(["events", "clicks", "events"]) == {
        "clicks": "eop.ns.p.progress.clicks",
        "events": "eop.ns.p.progress.events",
    }
    assert "eop.ns.p.progress.<source topic>" in names.where()


@pytest.mark.parametrize("source, sink", [(None, "b"), ("a", None), ("", "b")])
def test_a_cluster_that_does_not_tell_its_id_stops_the_runner(
    source: str | None, sink: str | None
) -> None:
    role = "source" if not source else "sink"
    with pytest.raises(EnvironmentNotReady, match=f"the {role} Kafka cluster did not tell"):
        progress_names("eop.ns.p", source, sink)


def test_a_progress_topic_named_like_the_sink_or_a_source_topic_is_a_clash() -> None:
    names = ProgressNames("eop.ns.p", progress_topics=True)
    assert name_clash(names, "in", ["in"], "out") is None
    assert name_clash(names, "in", ["in"], "eop.ns.p.progress.in") == (
        "the sink topic eop.ns.p.progress.in"
    )
    assert name_clash(names, "in", ["in", "eop.ns.p.progress.in"], "out") == (
        "the source topic eop.ns.p.progress.in"
    )
