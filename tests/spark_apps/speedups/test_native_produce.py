"""The sinks' fast path (eop_spark.speedups.native_produce) on the real broker.

Records queued from Arrow columns through librdkafka's batch call must reach
``read_committed`` readers exactly as ``produce()`` would have written them:
same keys, values (null and empty kept apart), partitions, order; a full
local queue waits instead of dropping; a refused record fails the
transaction and nothing of it becomes visible.  librdkafka does not copy the
records: the producer keeps their Arrow data until they are delivered.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pyarrow as pa
import pytest

from devenv.kafka import KafkaBroker
from devenv.runners import read_committed_messages
from eop_spark.contract.errors import EopError
from eop_spark.exactly_once.sink_contract import OutputLayout, produce_arrow_batch, produce_columns
from eop_spark.kafka import transactional_producer
from eop_spark.kafka.client_config import producer_config
from eop_spark.kafka.transactional_producer import TransactionalProducer
from eop_spark.runtime.runner import ARROW_PATH
from eop_spark.speedups import native_produce
from tests.plugins.kafka import TopicFactory

pytestmark = pytest.mark.kafka

Record = tuple[int, bytes | None, bytes | None]


def _producer(broker: KafkaBroker, **settings: Any) -> TransactionalProducer:
    client = {"bootstrap.servers": broker.bootstrap_servers} | settings
    conf = producer_config(client, f"eop.test.{uuid.uuid4().hex}", 60_000)
    return TransactionalProducer(conf, arrow_path=ARROW_PATH)  # as the runner builds them


def _records(broker: KafkaBroker, topic: str) -> list[Record]:
    return [(m.partition(), m.key(), m.value()) for m in read_committed_messages(broker, topic)]


def _batch(rows: int) -> pa.RecordBatch:
    """Keys and values of every shape: binary, string, null, empty; sliced from a bigger array."""
    values = [
        None if i % 7 == 3 else b"" if i % 11 == 5 else f"v{i}".encode() * (i % 5)
        for i in range(rows)
    ]
    keys = [None if i % 13 == 2 else f"k{i}" for i in range(rows)]
    table = pa.RecordBatch.from_pydict(
        {
            "value": pa.array([b"pad", *values], pa.binary()),
            "key": pa.array(["pad", *keys], pa.string()),
        }
    )
    return table.slice(1)  # a non-zero array offset, as a filtered or sliced batch has


def test_the_fast_path_is_on_for_the_sinks_producers(kafka_broker: KafkaBroker) -> None:
    producer = _producer(kafka_broker)
    try:
        assert producer.takes_arrow, "confluent-kafka's librdkafka was not found or not verified"
        assert native_produce.attach(producer._producer, "another.id") is None
    finally:
        producer.close()


def test_arrow_records_read_back_as_produce_writes_them(
    kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory
) -> None:
    batch = _batch(5_000)
    layout = OutputLayout(has_key=True)
    written = {}
    for path in ("arrow", "produce"):
        topic = kafka_topic_factory(4, prefix=path)
        producer = _producer(kafka_broker)
        producer.begin()
        if path == "arrow":
            assert produce_arrow_batch(producer, topic, batch, layout) == 5_000
        else:
            lists = [batch.column(name).to_pylist() for name in layout.columns()]
            assert produce_columns(producer, topic, lists, layout) == 5_000
        producer.commit()
        producer.close()
        # Stable sort: each partition's records in the order they were read.
        written[path] = sorted(_records(kafka_broker, topic), key=lambda r: r[0])
    keyed = {path: [r for r in records if r[1] is not None] for path, records in written.items()}
    assert keyed["arrow"] == keyed["produce"]  # same partition (murmur2 of the key), same order
    # Records without a key go to a random partition: compare their values only.
    unkeyed = {
        path: sorted(v or b"" for _, k, v in records if k is None)
        for path, records in written.items()
    }
    assert unkeyed["arrow"] == unkeyed["produce"]
    assert len(unkeyed["arrow"]) == len(range(2, 5_000, 13))
    values = [v for _, _, v in written["arrow"]]
    assert None in values and b"" in values  # null and empty values kept apart


def test_records_with_headers_or_a_partition_column_go_through_produce(
    kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(3)
    batch = pa.RecordBatch.from_pydict(
        {
            "value": pa.array(["a", "b", "c"]),
            "partition": pa.array([2, 0, 2], pa.int32()),
        }
    )
    producer = _producer(kafka_broker)
    producer.begin()
    assert produce_arrow_batch(producer, topic, batch, OutputLayout(has_partition=True)) == 3
    producer.commit()
    producer.close()
    placed = {value: partition for partition, _, value in _records(kafka_broker, topic)}
    assert placed == {b"a": 2, b"b": 0, b"c": 2}


def _through_a_small_queue(
    broker: KafkaBroker, topic: str, values: pa.Array, keys: pa.Array | None
) -> list[Record]:
    """Produce ``values`` (and ``keys``) in one transaction through a 500-record queue."""
    producer = _producer(broker, **{"queue.buffering.max.messages": 500})
    producer.begin()
    producer.produce_arrow(topic, values, keys)
    producer.commit()
    producer.close()
    return _records(broker, topic)


def test_a_full_local_queue_waits_and_keeps_the_order(
    kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    values = pa.array([b"%06d" % i for i in range(20_000)])
    records = _through_a_small_queue(kafka_broker, topic, values, None)
    assert [v for _, _, v in records] == values.to_pylist()


def test_a_full_queue_resumes_placed_records_partition_by_partition(
    kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory
) -> None:
    """Keyed records over 3 partitions through a 500-record queue: each partition in order."""
    topic = kafka_topic_factory(3)
    keys = pa.array([b"%06d" % i for i in range(20_000)])
    records = _through_a_small_queue(kafka_broker, topic, keys, keys)
    assert sorted(v for _, _, v in records) == keys.to_pylist()  # each record once
    placed = native_produce.partitions(keys, len(keys), 3, "murmur2_random")
    for partition in range(3):
        expected = [k for k, p in zip(keys.to_pylist(), placed, strict=True) if p == partition]
        assert [v for p, _, v in records if p == partition] == expected


def test_a_refused_record_fails_the_transaction_and_shows_nothing(
    kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(2)
    producer = _producer(kafka_broker)
    producer.begin()
    values = pa.array([b"ok", b"x" * 2_000_000, b"ok"])  # over librdkafka's message.max.bytes
    with pytest.raises(EopError, match=r"produce of transactional id .* failed: .*too large"):
        producer.produce_arrow(topic, values)
    assert producer.abort()
    producer.close()
    assert _records(kafka_broker, topic) == []


def _random_values(rows: int, size: int) -> pa.Array:
    return pa.array([os.urandom(size) for _ in range(rows)], pa.binary())


def test_queued_records_keep_their_data_after_the_caller_drops_it(
    kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory
) -> None:
    topic = kafka_topic_factory(1)
    # A long linger: the records wait in librdkafka's queue while their arrays are dropped.
    producer = _producer(kafka_broker, **{"linger.ms": 2_000})
    producer.begin()
    expected: list[bytes] = []
    for _ in range(4):
        values = _random_values(2_000, 1_024)
        expected += values.to_pylist()
        producer.produce_arrow(topic, values)
        del values
    # New arrays of the same sizes: they take the memory of freed ones, if any was freed.
    scribbles = [_random_values(2_000, 1_024) for _ in range(8)]
    producer.commit()
    producer.close()
    assert scribbles and [v for _, _, v in _records(kafka_broker, topic)] == expected


def test_past_the_hold_limit_the_producer_waits_for_delivery_and_lets_go(
    kafka_broker: KafkaBroker, kafka_topic_factory: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = kafka_topic_factory(2)
    batch = _random_values(1_000, 1_024)
    monkeypatch.setattr(transactional_producer, "HOLD_LIMIT_BYTES", 2 * batch.nbytes)
    producer = _producer(kafka_broker, **{"linger.ms": 2_000})
    producer.begin()
    held = []
    for _ in range(7):
        producer.produce_arrow(topic, batch)
        held.append(len(producer._held))
    producer.commit()
    assert len(producer._held) == 0  # delivered: nothing kept after the commit
    producer.close()
    assert held == [1, 2, 1, 2, 1, 2, 1]  # never more than the limit (plus the newest)
    assert len(_records(kafka_broker, topic)) == 7_000


def test_partitions_are_where_librdkafkas_murmur2_puts_them() -> None:
    """Keys of every length 0-100 (and a sliced array): the partition librdkafka computes."""
    import ctypes
    import random

    lib = native_produce.librdkafka()
    assert lib is not None
    murmur2 = lib.lib.rd_kafka_msg_partitioner_murmur2
    murmur2.restype = ctypes.c_int32
    murmur2.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int32]
    murmur2.argtypes += [ctypes.c_void_p, ctypes.c_void_p]
    rng = random.Random(7)
    keys = [rng.randbytes(rng.randint(0, 100)) for _ in range(5_000)]
    array = pa.array([b"pad", *keys], pa.binary()).slice(1)
    for count in (1, 4, 7, 100):
        expected = [murmur2(None, k, len(k), count, None, None) for k in keys]
        assert native_produce.partitions(array, len(keys), count, "murmur2").tolist() == expected
    # Without a key: murmur2 hashes an empty key; murmur2_random picks one partition.
    unkeyed = native_produce.partitions(None, 50, 7, "murmur2_random")
    assert len(set(unkeyed.tolist())) == 1
    empty = murmur2(None, b"", 0, 7, None, None)
    assert set(native_produce.partitions(None, 50, 7, "murmur2").tolist()) == {empty}
