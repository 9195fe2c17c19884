"""How a partitioned task learns its batch: the job's local property, read in the worker."""

from __future__ import annotations

import pytest

from eop_spark.contract.errors import PipelineFailed
from eop_spark.contract.progress_names import ProgressNames
from eop_spark.contract.spec import Duration
from eop_spark.exactly_once.batch_markers import batch_marker
from eop_spark.exactly_once.partitioned.task import (
    BATCH_PROPERTY,
    TaskFunction,
    decode_batch,
    encode_batch,
)
from eop_spark.exactly_once.sink_contract import output_layout
from eop_spark.exactly_once.sink_settings import SinkSettings

SINK = SinkSettings(
    topic="out",
    client_config={"bootstrap.servers": "127.0.0.1:9"},
    transactional_id_prefix="eop.ns.p",
    transaction_timeout=Duration("60s"),
    progress=ProgressNames("eop.ns.p"),
    group_metadata=b"",
)


def test_a_task_gets_the_end_offsets_and_marker_of_its_batch() -> None:
    end = {("orders.v1", 0): 17, ("orders.v1", 3): 0, ("refunds", 0): 1_000_000_000_000}
    marker = batch_marker("1b4e28ba-2fa1-11d2-883f-0016d3cca427", 42)
    function = TaskFunction(SINK, output_layout([("value", "binary")]), "run")

    task = function.task(encode_batch(end, marker), spark_batch="42")

    assert task.end_offsets == end
    assert task.marker == marker
    assert task.sink == SINK
    assert task.topic is None  # two topics: the rows carry theirs


@pytest.mark.parametrize("missing", [None, ""])
def test_a_task_outside_the_sinks_job_refuses_to_commit(missing: str | None) -> None:
    with pytest.raises(PipelineFailed, match=BATCH_PROPERTY):
        decode_batch(missing)


def test_a_task_refuses_the_offsets_of_another_batch() -> None:
    stale = encode_batch({("t", 0): 10}, batch_marker("q", 41))
    with pytest.raises(PipelineFailed, match="batch 42 was given the offsets of batch 41"):
        decode_batch(stale, spark_batch="42")
