"""Stateless generations on a real broker: G is set to startingOffsets once, before batch 0."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Producer

from devenv.kafka import KafkaBroker
from eop_spark.contract.progress_names import ProgressNames
from eop_spark.contract.run_config import RunConfig
from eop_spark.exactly_once.offsets_log import LocalFiles, OffsetsLog
from eop_spark.exactly_once.progress_group import ProgressGroup, commit_offsets
from eop_spark.exactly_once.stateless_reset import reset_for_stateless_generation
from tests.plugins.kafka import TopicFactory


def _config(broker: KafkaBroker, topic: str, root: Path, starting: str, group: str) -> RunConfig:
    return RunConfig.model_validate(
        {
            "pipeline": "default.reset",
            "source": {
                "kafka": {
                    "bootstrapServers": broker.bootstrap_servers,
                    "topics": [topic],
                    "startingOffsets": starting,
                }
            },
            "transform": {"sql": "SELECT key, value FROM source"},
            "sink": {"kafka": {"bootstrapServers": broker.bootstrap_servers, "topic": topic}},
            "transactionalIdPrefix": group,
            "progressGroup": group,
            "checkpointRoot": str(root),
            "generation": 1,
            "resetProgress": True,
        }
    )


def test_a_stateless_generation_moves_the_progress_group_to_starting_offsets(
    kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topic = kafka_topic_factory(2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    for i in range(6):
        producer.produce(topic, value=b"x", partition=i % 2)
    producer.flush(30)
    group = f"eop.test.{topic}"
    sink_conf = {"bootstrap.servers": kafka_broker.bootstrap_servers}
    partitions = [(topic, 0), (topic, 1)]
    names = ProgressNames(group)
    commit_offsets(names, {(topic, 0): 3, (topic, 1): 3}, sink_conf)  # G at the end

    config = _config(kafka_broker, topic, tmp_path, "earliest", group)
    log = OffsetsLog(config.checkpoint_location, LocalFiles())
    assert reset_for_stateless_generation(config, log, partitions, sink_conf, names) == {
        (topic, 0): 0,
        (topic, 1): 0,
    }
    progress = ProgressGroup(names, sink_conf)
    assert progress.committed(partitions) == {(topic, 0): 0, (topic, 1): 0}

    # Explicit JSON offsets, partitions it leaves out start at the earliest offset.
    explicit = _config(kafka_broker, topic, tmp_path, f'{{"{topic}": {{"1": 2}}}}', group)
    reset_for_stateless_generation(explicit, log, partitions, sink_conf, names)
    assert progress.committed(partitions) == {(topic, 0): 0, (topic, 1): 2}

    # Once the generation's query wrote a batch, a restarted driver never resets again.
    offsets = Path(config.checkpoint_location) / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "0").write_text('v1\n{}\n{"' + topic + '":{"0":0,"1":2}}\n')
    latest = _config(kafka_broker, topic, tmp_path, "latest", group)
    assert reset_for_stateless_generation(latest, log, partitions, sink_conf, names) is None
    assert progress.committed(partitions) == {(topic, 0): 0, (topic, 1): 2}

    # And generations that do not ask for it are never reset.
    plain = latest.model_copy(update={"reset_progress": None, "generation": 2})
    fresh = OffsetsLog(plain.checkpoint_location, LocalFiles())
    assert reset_for_stateless_generation(plain, fresh, partitions, sink_conf, names) is None
