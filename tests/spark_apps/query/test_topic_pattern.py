"""topicPattern on a real broker and real Spark: whole names only, internal topics never."""

from __future__ import annotations

import re

from devenv.runners import produce
from tests.plugins.kafka import TopicFactory
from tests.spark_apps.conftest import PipelineFactory
from tests.spark_apps.runs import assert_exactly_once, finish


def test_a_pattern_reads_its_topics_and_never_one_whose_name_starts_with_two_underscores(
    make_pipeline: PipelineFactory, kafka_topic_factory: TopicFactory
) -> None:
    pipeline = make_pipeline(source_partitions=2)
    # A topic the pattern matches but Kafka's naming reserves for internal topics, and one
    # that merely contains a match (Spark's own source keeps a topic when the regex is found).
    internal = kafka_topic_factory(1, prefix=f"__{pipeline.source_topic}")
    longer = f"{pipeline.source_topic}-dlq"
    pipeline.broker.create_topic(longer, 1)
    produce(pipeline.broker, pipeline.source_topic, ((f"k{i}", "v", i % 2) for i in range(20)))
    for other in (internal, longer):
        produce(pipeline.broker, other, ((f"{other}-{i}", "v", 0) for i in range(5)))
    source = {
        "kafka": {
            "bootstrapServers": pipeline.broker.bootstrap_servers,
            "topicPattern": f"(__)?{re.escape(pipeline.source_topic)}",
        }
    }
    finish(pipeline, pipeline.config(source=source), timeout=240)
    assert_exactly_once(pipeline.output(), [f"k{i}" for i in range(20)])
    assert pipeline.progress(internal) == {} and pipeline.progress(longer) == {}
