"""Invariant 11: brokers fail under running pipelines, and the output stays exactly once.

Three pipelines run side by side on a replicated cluster (3 nodes, RF 3,
``min.insync.replicas`` 2: ``kafka_cluster``, Kafka 4.x, and ``field_cluster``, the Kafka
3.x release users still run), one per way a batch commits: partitioned with the tasks
in the JVM (the default), partitioned with the tasks in Python workers
(``EOP_NO_JVM_WRITER=1``) and coordinated. They read one source topic that a producer
writes to all along (uniquely keyed records, a few a second per partition, small batches
through ``maxOffsetsPerTrigger``), and the faults hit the cluster while batches run:

* a rolling restart (``KafkaCluster.roll``: SIGTERM one node at a time, the active
  controller last, as Strimzi does) costs no runner exit, and every pipeline drains the
  backlog the roll left within :data:`CATCH_UP_S` of its end;
* SIGKILL, then restart, of the node that leads a source partition, of the one that leads
  a sink partition, of the transaction coordinator of a pipeline's transactional id, of the
  progress group's coordinator and of the active controller: a runner may exit at most
  :data:`EXITS_PER_KILL` times per kill, each time with its reason on its last line
  (``eop: error: [...]``), and is restarted at once, as its StatefulSet would.

After each kill every pipeline commits a batch after the node came back, and drains the
backlog, each within :data:`KILL_RECOVERY_S`. At the end, as
Kafka's own system tests check: a read_committed reader sees every input record's output
exactly once in each sink (none missing, none repeated), and each progress group G holds the
source end offsets.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from devenv.kafka_cluster import KafkaCluster
from devenv.runners import Offsets, Pipeline, Runner
from eop_spark.contract.termination import FAILURE_PREFIX
from tests.plugins.kafka import FIELD_KAFKA_VERSION, KAFKA_VERSION, assert_runs_release

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]

PARTITIONS = 4
#: Records the producer writes per second (over all partitions), during the whole test.
RATE = 40
#: Offsets per batch: a few batches drain what a fault holds up.
PER_BATCH = 200
#: Seconds within which every pipeline drains the backlog a rolling restart left, from its
#: end (measured 4.5-6 s on a busy 2-core machine, the roll itself 110-135 s; over 120 s
#: once on a machine so loaded that a batch's transaction stayed open 28 s).
CATCH_UP_S = 240.0
#: The sinks' transactionTimeout: a call stuck in a transaction whose coordinator was killed
#: is given up after it (the default 60s would only make each kill's recovery slower; 15s
#: was shorter than a batch's transaction on an overloaded machine, which the broker then
#: aborted, so the batch ran again).
TRANSACTION_TIMEOUT = "30s"
#: Seconds within which every pipeline commits a batch after a killed node is back, and then
#: drains the backlog (measured: 3-6 s and 6-16 s; 80 s and 84 s with a 60s transaction
#: timeout when the node was G's coordinator, as a stuck send_offsets_to_transaction is given
#: up only at the transaction's end).
KILL_RECOVERY_S = 240.0
#: Runner exits a hard kill of one node may cost one pipeline.
EXITS_PER_KILL = 1

#: The three ways a batch commits: run config ``commitMode`` and the runner's environment.
PATHS: dict[str, tuple[str, dict[str, str]]] = {
    "jvm-tasks": ("partitioned", {}),
    "python-tasks": ("partitioned", {"EOP_NO_JVM_WRITER": "1"}),
    "coordinated": ("coordinated", {}),
}


class InputWriter:
    """A thread producing uniquely keyed records to the source topic at :data:`RATE`.

    Idempotent and ``acks=all``, as a careful upstream writes: a broker fault delays its
    records but neither loses nor repeats them. :meth:`stop` flushes and returns the keys
    the cluster acknowledged.
    """

    def __init__(self, cluster: KafkaCluster, topic: str) -> None:
        self.topic = topic
        self.acked: list[str] = []
        self.failed: list[str] = []
        settings = {"enable.idempotence": True, "acks": "all", "linger.ms": 20, "log_level": 2}
        self._producer = Producer(cluster.client_config(settings))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="input-writer", daemon=True)
        self._thread.start()

    def _delivered(self, error: Any, message: Any) -> None:
        key = message.key().decode()
        (self.failed if error is not None else self.acked).append(key)

    def _run(self) -> None:
        i = 0
        start = time.monotonic()
        while not self._stop.is_set():
            key = f"k{i:06d}"
            self._producer.produce(
                self.topic, key.encode(), key.encode(), i % PARTITIONS, on_delivery=self._delivered
            )
            i += 1
            self._producer.poll(0)
            time.sleep(max(0.0, start + i / RATE - time.monotonic()))

    def close(self) -> None:
        """Stop writing, drop what is not delivered yet."""
        self._stop.set()
        self._thread.join(30)
        self._producer.purge()

    def stop(self) -> list[str]:
        """Stop writing; every key written and acknowledged (none may have failed)."""
        self._stop.set()
        self._thread.join(30)
        assert self._producer.flush(120) == 0, "records of the input never acknowledged"
        assert not self.failed, f"{len(self.failed)} input records failed, e.g. {self.failed[:5]}"
        return self.acked


def _keys(records: list[tuple[bytes | None, bytes | None]]) -> Counter[str | None]:
    """How many records hold each key."""
    return Counter(key.decode() if key is not None else None for key, _ in records)


def _difference(output: Counter[str | None], source: Counter[str | None]) -> str:
    """How an output differs from one record out per source record: repeated, missing and
    unexpected keys, a few of each."""
    repeated = {k: output[k] for k in output - source if k in source}
    missing = list((source - output).keys())
    unexpected = [k for k in output if k not in source]
    return (
        f"{len(repeated)} keys repeated, e.g. {list(repeated.items())[:5]}; "
        f"{len(missing)} missing, e.g. {missing[:5]}; "
        f"{len(unexpected)} unexpected, e.g. {unexpected[:5]}"
    )


@dataclass
class Slot:
    """One pipeline's runner, restarted whenever it exits, as a StatefulSet does."""

    pipeline: Pipeline
    config: dict[str, Any]
    env: dict[str, str]
    #: Exits of its runners: (exit code, last line of stderr).
    exits: list[tuple[int, str]] = field(default_factory=list)

    @property
    def runner(self) -> Runner:
        """The current runner."""
        return self.pipeline.runners[-1]

    def start(self) -> None:
        """Start a runner."""
        self.pipeline.start(self.config, env=self.env)

    def tend(self) -> None:
        """Record the runner's exit, if it exited, and start another."""
        if self.runner.alive:
            return
        stderr = self.runner.stderr.strip().splitlines()
        self.exits.append((self.runner.proc.returncode, stderr[-1] if stderr else ""))
        self.start()

    def committed_after(self, moment: float) -> bool:
        """Whether a runner logged a batch that finished after ``moment`` (``time.time()``)."""
        return any(b["ts"] > moment for b in self.runner.batches())

    @staticmethod
    def committed_after_that(moment: float) -> Callable[[Slot], bool]:
        """:meth:`committed_after` ``moment``, as a condition for :meth:`Fleet.wait`."""
        return lambda slot: slot.committed_after(moment)


class Fleet:
    """The three pipelines on one source topic, each runner tended by a background thread."""

    def __init__(self, cluster: KafkaCluster, work: Path) -> None:
        self.cluster = cluster
        #: What happened when (the fault schedule, the figures): printed, and kept here.
        self.journal = work / "faults.log"
        self.source_topic = f"in-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(self.source_topic, PARTITIONS)
        self.slots: dict[str, Slot] = {}
        for path, (mode, env) in PATHS.items():
            sink_topic = f"out-{path}-{uuid.uuid4().hex[:8]}"
            cluster.create_topic(sink_topic, PARTITIONS)
            pipeline = Pipeline(cluster, work / path, self.source_topic, sink_topic)
            pipeline.work.mkdir(parents=True)
            source = {
                "kafka": {
                    "bootstrapServers": cluster.bootstrap_servers,
                    "topics": [self.source_topic],
                    "maxOffsetsPerTrigger": PER_BATCH,
                }
            }
            sink = {
                "kafka": {
                    "bootstrapServers": cluster.bootstrap_servers,
                    "topic": sink_topic,
                    "commitMode": mode,
                    "transactionTimeout": TRANSACTION_TIMEOUT,
                }
            }
            config = pipeline.config(source=source, sink=sink)
            self.slots[path] = Slot(pipeline, config, env)
        self._stop = threading.Event()
        self._tender = threading.Thread(target=self._tend, name="tender", daemon=True)

    def say(self, line: str) -> None:
        """Print ``line`` and add it to :attr:`journal`."""
        print(line)
        with self.journal.open("a") as journal:
            journal.write(line + "\n")

    def _tend(self) -> None:
        while not self._stop.wait(0.5):
            for slot in self.slots.values():
                slot.tend()

    def start(self) -> None:
        """Start every runner and wait until each has committed a batch."""
        for slot in self.slots.values():
            slot.start()
        moment = time.time()
        self.wait("a first batch of every pipeline", Slot.committed_after_that(moment), 240)
        self._tender.start()

    def wait(self, what: str, done: Callable[[Slot], bool], timeout: float) -> float:
        """Wait until ``done(slot)`` holds for every pipeline; the seconds it took."""
        start = time.monotonic()
        pending = dict(self.slots)
        while pending:
            for path, slot in list(pending.items()):
                if done(slot):
                    del pending[path]
            if time.monotonic() - start > timeout:
                tails = "\n".join(
                    f"=== {p}\n{s.runner.tail()}\n{s.runner.stacks()}" for p, s in pending.items()
                )
                raise AssertionError(f"{what}: not within {timeout}s for {list(pending)}\n{tails}")
            time.sleep(0.5)
        return time.monotonic() - start

    def exits(self) -> dict[str, list[tuple[int, str]]]:
        """Every pipeline's runner exits so far."""
        return {path: list(slot.exits) for path, slot in self.slots.items()}

    def catch_up(self, timeout: float = CATCH_UP_S) -> float:
        """Seconds until every G reaches the source end offsets of now (the backlog drained)."""
        ends = self.slots["jvm-tasks"].pipeline.end_offsets()
        return self.wait(
            "G past the backlog", lambda s: _at_least(s.pipeline.progress(), ends), timeout
        )

    def finish(self, acknowledged: list[str]) -> None:
        """Let every G reach the source end, stop the runners (exit 0), check the output: one
        record out per record in the source, as a read_committed reader sees both."""
        self.wait("G at the source end offsets", lambda s: s.pipeline.caught_up(), 240)
        self._stop.set()
        self._tender.join(30)
        for path, slot in self.slots.items():
            slot.runner.terminate()
            assert slot.runner.wait(180) == 0, f"{path}\n{slot.runner.tail()}"
        any_pipeline = next(iter(self.slots.values())).pipeline
        source = _keys(any_pipeline.output(any_pipeline.source_topic))
        # Every acknowledged key is in the source. The writer's idempotent producer has once
        # written a record twice (two offsets, one timestamp) across a kill of the partition's
        # leader: two input records, whose output is two records.
        assert set(source) == set(acknowledged), "the source is not what the writer wrote"
        repeated = {k: n for k, n in source.items() if n > 1}
        if repeated:
            self.say(f"records the writer wrote more than once: {repeated}")
        self.say(f"{sum(source.values())} input records, {len(source)} keys")
        for path, slot in self.slots.items():
            self.say(f"{path}: {len(slot.pipeline.runners)} runners, exits {slot.exits}")
            output = _keys(slot.pipeline.output())
            assert output == source, f"{path}: " + _difference(output, source)
            assert slot.pipeline.progress() == slot.pipeline.end_offsets(), path

    def cleanup(self) -> None:
        """Stop the tending and every runner."""
        self._stop.set()
        for slot in self.slots.values():
            slot.pipeline.cleanup()


def _at_least(progress: Offsets, ends: Offsets) -> bool:
    return all(progress.get(tp, 0) >= end for tp, end in ends.items())


@contextmanager
def fleet_on(cluster: KafkaCluster, work: Path) -> Iterator[tuple[Fleet, InputWriter]]:
    """The three pipelines running, with the producer writing; both stopped afterwards."""
    fleet = Fleet(cluster, work)
    writer = InputWriter(cluster, fleet.source_topic)
    try:
        fleet.start()
        yield fleet, writer
    finally:
        writer.close()
        fleet.cleanup()


@dataclass
class OperatorChecks:
    """The operator's health check of the JVM-tasks pipeline, in its own process (see
    ``operator_checks``), checking all through the faults."""

    process: subprocess.Popen[bytes]
    log: Path

    def survived(self, since: float, say: Callable[[str], None] = print) -> None:
        """The process lives, no check raised what the operator does not catch, and a check
        after ``since`` (epoch seconds) read the progress again."""
        alive = self.process.poll() is None
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        assert alive, f"the checks' process died (exit {self.process.returncode}): {lines[-5:]}"
        errors = [line for line in lines if line.startswith("error ")]
        assert not errors, errors[:5]
        good = [float(line.split()[1]) for line in lines if line.startswith("ok ")]
        assert good and max(good) > since, f"no good check after the faults: {lines[-5:]}"
        unavailable = sum(line.startswith("unavailable ") for line in lines)
        say(f"operator checks: {len(good)} good, {unavailable} unavailable, none failed")


@contextmanager
def operator_checks(cluster: KafkaCluster, fleet: Fleet, log: Path) -> Iterator[OperatorChecks]:
    """Run the operator's check of the JVM-tasks pipeline's progress while the block runs."""
    pipeline = fleet.slots["jvm-tasks"].pipeline
    module = "tests.spark_apps.exactly_once.operator_checks"
    args = [cluster.bootstrap_servers, fleet.source_topic, pipeline.sink_topic, pipeline.group]
    process = subprocess.Popen([sys.executable, "-m", module, *args, str(log)], cwd=ROOT)
    try:
        yield OperatorChecks(process, log)
    finally:
        process.kill()
        process.wait(30)


def roles(cluster: KafkaCluster, fleet: Fleet) -> dict[str, int | None]:
    """The node that holds each role the pipelines rely on, right now."""
    jvm, python = fleet.slots["jvm-tasks"].pipeline, fleet.slots["python-tasks"].pipeline
    coordinated = fleet.slots["coordinated"].pipeline
    return {
        "source partition leader": cluster.leader_of(fleet.source_topic, 0),
        "sink partition leader": cluster.leader_of(jvm.sink_topic, 0),
        "transaction coordinator (driver id)": cluster.transaction_coordinator(
            f"{coordinated.group}.driver"
        ),
        "transaction coordinator (partition id)": cluster.transaction_coordinator(
            f"{python.group}.{fleet.source_topic}.0"
        ),
        "progress group coordinator": cluster.group_coordinator(jvm.group),
        "active controller": cluster.active_controller(),
    }


def test_rolling_restart_and_hard_kills_under_running_pipelines(
    kafka_cluster_chaos: KafkaCluster, spark_jars: list[Path], tmp_path: Path
) -> None:
    """A roll costs no exit; kills of every role cost a bounded number, each with a reason
    on Kafka 4.x."""
    assert_runs_release(kafka_cluster_chaos, KAFKA_VERSION)
    roll_and_kill(kafka_cluster_chaos, tmp_path)


def test_rolling_restart_and_hard_kills_on_the_kafka_3_release_users_run(
    field_cluster_chaos: KafkaCluster, spark_jars: list[Path], tmp_path: Path
) -> None:
    """The same faults on a cluster of the Kafka 3.x release users still run (transaction
    protocol v1 only: a coordinator's failover and a fenced producer go as 3.x does them)."""
    assert_runs_release(field_cluster_chaos, FIELD_KAFKA_VERSION)
    roll_and_kill(field_cluster_chaos, tmp_path)


def roll_and_kill(cluster: KafkaCluster, tmp_path: Path) -> None:
    """A roll costs no exit; kills of every role cost a bounded number, each with a reason.

    The kills go by role: the node that holds the first role no kill has hit yet is killed,
    which hits every role it holds at that moment; on 3 nodes a few kills hit them all.
    """
    with (
        fleet_on(cluster, tmp_path) as (fleet, writer),
        operator_checks(cluster, fleet, tmp_path / "checks.log") as checks,
    ):
        rolled = time.monotonic()
        cluster.roll()
        fleet.say(f"Kafka {cluster.nodes[0].version}: roll {time.monotonic() - rolled:.0f}s")
        assert fleet.exits() == {path: [] for path in PATHS}, "a rolling restart cost exits"
        fleet.say(f"  caught up {fleet.catch_up():.1f}s after the roll")
        assert fleet.exits() == {path: [] for path in PATHS}, "a rolling restart cost exits"

        unhit = list(roles(cluster, fleet))
        kills = 0
        while unhit:
            now = roles(cluster, fleet)
            node = now[unhit[0]]
            assert node is not None, f"no {unhit[0]} right now"
            held = [role for role in unhit if now[role] == node]
            unhit = [role for role in unhit if role not in held]
            cluster.kill(node)
            kills += 1
            killed = time.monotonic()
            cluster.start(node)
            back = time.time()
            fleet.say(f"kill {node} ({', '.join(held)}): back in {time.monotonic() - killed:.0f}s")
            took = fleet.wait(
                "a batch after the node came back",
                Slot.committed_after_that(back),
                KILL_RECOVERY_S,
            )
            fleet.say(f"  a batch of every pipeline {took:.1f}s later")
            caught_up = fleet.catch_up(KILL_RECOVERY_S)
            fleet.say(f"  caught up {caught_up:.1f}s later; exits so far {fleet.exits()}")
        fleet.finish(writer.stop())
        checks.survived(back, fleet.say)
        for path, exits in fleet.exits().items():
            assert len(exits) <= EXITS_PER_KILL * kills, (path, exits)
            for code, line in exits:
                assert code != 0 and line.startswith(f"{FAILURE_PREFIX}["), (path, code, line)
