"""Invariants 1-5 around restarts: replays, graceful stops, lost checkpoints, upstream
transactions, and two runners of one pipeline at once."""

from __future__ import annotations

import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from devenv.runners import Pipeline, Runner, client_config, produce
from tests.spark_apps.conftest import PipelineFactory
from tests.spark_apps.runs import assert_exactly_once, finish

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

PASSTHROUGH = "SELECT key, value FROM source"


def keyed_input(pipeline: Pipeline, count: int, prefix: str = "k") -> list[str]:
    keys = [f"{prefix}{i:06d}" for i in range(count)]
    produce(pipeline.broker, pipeline.source_topic, ((k, k, i % 4) for i, k in enumerate(keys)))
    return keys


def config_for(pipeline: Pipeline, mode: str, max_offsets: int, **overrides: Any) -> dict[str, Any]:
    source = {
        "kafka": {
            "bootstrapServers": pipeline.broker.bootstrap_servers,
            "topics": [pipeline.source_topic],
            "maxOffsetsPerTrigger": max_offsets,
        }
    }
    sink = {
        "kafka": {
            "bootstrapServers": pipeline.broker.bootstrap_servers,
            "topic": pipeline.sink_topic,
            "commitMode": mode,
        }
    }
    return pipeline.config(
        source=source, sink=sink, **({"transform": {"sql": PASSTHROUGH}} | overrides)
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["partitioned", "coordinated"])
def test_a_batch_committed_to_kafka_but_not_to_the_checkpoint_is_skipped(
    make_pipeline: PipelineFactory, mode: str
) -> None:
    """The crash window Spark alone gets wrong: output committed, commits/N not written."""
    pipeline = make_pipeline()
    keys = keyed_input(pipeline, 8000)
    config = config_for(pipeline, mode, 2000, trigger={"availableNow": True})
    first = pipeline.start(config)
    assert first.wait(300) == 0, first.tail()
    last = max(b["batch_id"] for b in first.batches())
    # As if the driver died right after the Kafka commit of the last batch.
    commits = pipeline.work / "checkpoints" / "gen-0" / "commits"
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink()

    replay = pipeline.start(config)
    assert replay.wait(300) == 0, replay.tail()
    replayed = replay.batches()
    assert [(b["batch_id"], b["status"], b["rows_out"]) for b in replayed] == [(last, "skipped", 0)]
    assert_exactly_once(pipeline.output(), keys)
    assert pipeline.progress() == pipeline.end_offsets()


@pytest.mark.slow
def test_sigterm_lets_the_batch_in_flight_commit_and_restart_does_no_replay(
    make_pipeline: PipelineFactory,
) -> None:
    pipeline = make_pipeline()
    keys = keyed_input(pipeline, 16_000)
    slow = {"python": {"module": "tests.spark_apps.slow_transform", "function": "slow_upper"}}
    config = config_for(pipeline, "auto", 2000, transform=slow)
    runner = pipeline.start(config)
    runner.wait_batches(2)
    time.sleep(0.5)  # batches take ~2 s back to back: one is in flight now
    signalled = time.time()
    runner.terminate()
    assert runner.wait(120) == 0, runner.tail()
    before = runner.batches()
    assert before[-1]["committed_at"] > signalled, "no batch committed after SIGTERM"
    assert runner.stderr == ""
    # Spark recorded the last batch in its checkpoint before the runner stopped the query.
    commits = pipeline.work / "checkpoints" / "gen-0" / "commits"
    assert (commits / str(before[-1]["batch_id"])).exists(), sorted(
        p.name for p in commits.iterdir()
    )

    rest = pipeline.start(
        config_for(pipeline, "auto", 2000, transform=slow, trigger={"availableNow": True})
    )
    assert rest.wait(300) == 0, rest.tail()
    after = rest.batches()
    assert after[0]["batch_id"] == before[-1]["batch_id"] + 1
    assert {b["status"] for b in after} == {"committed"}, "restart replayed work"
    assert_exactly_once(pipeline.output(), keys)
    assert pipeline.progress() == pipeline.end_offsets()


def _lose(directory: Path) -> None:
    """Delete ``directory`` while a runner writes into it. A file the runner adds during one
    pass leaves that pass a directory that is not empty: delete until a pass ends with the
    directory gone."""
    deadline = time.monotonic() + 30
    while directory.exists():
        assert time.monotonic() < deadline, f"{directory} could not be deleted in 30 s"
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["partitioned", "coordinated"])
def test_losing_the_checkpoint_loses_and_repeats_nothing(
    make_pipeline: PipelineFactory, mode: str
) -> None:
    pipeline = make_pipeline()
    keys = keyed_input(pipeline, 40_000)
    config = config_for(pipeline, mode, 4000)
    runner = pipeline.start(config)
    runner.wait_batches(3)
    _lose(pipeline.work / "checkpoints" / "gen-0")
    time.sleep(random.uniform(0, 1.5))
    runner.kill()

    resumed = pipeline.start(config, generation=1)
    resumed.wait_for("G to reach the source end offsets", pipeline.caught_up, 400)
    resumed.terminate()
    assert resumed.wait(120) == 0, resumed.tail()
    assert any("resume from progress group" in m for m in resumed.messages())
    assert_exactly_once(pipeline.output(), keys)


def test_records_of_aborted_upstream_transactions_never_reach_the_output(
    make_pipeline: PipelineFactory,
) -> None:
    pipeline = make_pipeline()
    producer = Producer(client_config(pipeline.broker, transactional_id=f"up-{pipeline.name}"))
    producer.init_transactions(30)
    committed: list[str] = []
    for txn in range(30):
        producer.begin_transaction()
        batch = [f"t{txn:02d}-{i:03d}" for i in range(200)]
        for i, key in enumerate(batch):
            producer.produce(pipeline.source_topic, key.encode(), key.encode(), partition=i % 4)
        # Written to the log before the abort: an abort purges records not sent yet (and
        # the broker may refuse an EndTxn that overtakes the partitions being added).
        producer.flush(30)
        if txn % 3 == 1:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed += batch
    # One transaction stays open while the runner runs: its records wait (LSO), then count.
    producer.begin_transaction()
    late = [f"late-{i:03d}" for i in range(100)]
    for i, key in enumerate(late):
        producer.produce(pipeline.source_topic, key.encode(), key.encode(), partition=i % 4)
    producer.flush(30)

    runner = pipeline.start(config_for(pipeline, "auto", 3000))
    runner.wait_batches(1)
    producer.commit_transaction(30)
    runner.wait_for("G to reach the source end offsets", pipeline.caught_up, 300)
    runner.terminate()
    assert runner.wait(120) == 0, runner.tail()
    assert_exactly_once(pipeline.output(), committed + late)


def _feed(pipeline: Pipeline, keys: list[str], chunk: int = 1000, pause: float = 0.5) -> None:
    """Produce ``keys`` little by little, so concurrent runners see different batch bounds."""
    for start in range(0, len(keys), chunk):
        produce(
            pipeline.broker,
            pipeline.source_topic,
            ((k, k, i % 4) for i, k in enumerate(keys[start : start + chunk], start=start)),
        )
        time.sleep(pause)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["partitioned", "coordinated"])
def test_two_runners_at_once_still_write_exactly_once(
    make_pipeline: PipelineFactory, mode: str
) -> None:
    """A zombie next to the live runner, with its own checkpoint (``eop run`` beside the
    cluster, or a pod whose volume was replaced): batch bounds differ between the two.

    Both run while input arrives, and until each has committed batches and G has reached
    the input's end (at most 60 s); whichever stops (fenced, or, in coordinated mode,
    refusing a batch G has partly passed) is restarted at once, as a StatefulSet would.
    The partitioned sink skips per offset; the coordinated one stops rather than
    duplicate, and a new checkpoint generation resumes from G.
    """
    pipeline = make_pipeline()
    keys = [f"k{i:06d}" for i in range(30_000)]
    config = config_for(pipeline, mode, 3000)
    roots = [str(pipeline.work / "checkpoints"), str(pipeline.work / "checkpoints-zombie")]
    slots = [pipeline.start(config | {"checkpointRoot": root}) for root in roots]
    started = list(slots)
    of_root: list[list[Runner]] = [[runner] for runner in slots]
    feeder = threading.Thread(target=_feed, args=(pipeline, keys), daemon=True)
    feeder.start()

    def fenced() -> int:
        return sum(b["fenced"] for r in started for b in r.batches())

    def contended() -> bool:
        """Both checkpoints have batches, the input is all written and G is at its end."""
        both = all(any(r.batches() for r in runners) for runners in of_root)
        return (
            both
            and not feeder.is_alive()
            and (mode != "partitioned" or fenced() > 0)
            and pipeline.caught_up()
        )

    until = time.monotonic() + 60
    while time.monotonic() < until and not contended():
        for i, runner in enumerate(slots):
            if not runner.alive:
                slots[i] = pipeline.start(config | {"checkpointRoot": roots[i]})
                started.append(slots[i])
                of_root[i].append(slots[i])
        time.sleep(1)
    feeder.join()
    for runner in slots:
        runner.kill()
    if mode == "partitioned":
        # The other runner's takeovers show in the batch log (and the fenced counter).
        assert fenced() > 0

    generation = 1 if mode == "coordinated" else None
    finish(pipeline, config | {"checkpointRoot": roots[0]}, generation=generation)
    assert_exactly_once(pipeline.output(), keys)
    assert pipeline.progress() == pipeline.end_offsets()
