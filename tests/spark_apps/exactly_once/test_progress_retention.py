"""Progress that outlives the broker's offsets retention (invariant 6), on real brokers.

A replicated cluster of its own (3 nodes, each with
``offsets.retention.minutes=1``) expires the progress group's offsets a minute
after their last commit, on whichever node is the group's coordinator.  Four
pipelines process their input, then stay idle past the retention side by side:
two with their runner up and idle (partitioned and coordinated: the runner's
keep-alive, at an interval from the retention it reads from every broker, one
call per broker: librdkafka refuses several in one, and the keep-alive then
fell back to an hourly refresh; more input after the refreshes is processed
once), two suspended (no runner: the operator's keep-alive function, called as
its health daemon does; ``tests/integration/test_health.py`` runs the daemon
itself against a single broker).  Then every one starts a new checkpoint
generation, which resumes from the progress group: exactly once, nothing
repeated.  Without the keep-alive the new generations find no progress and
stop (or, without that guard too, repeat all their input, as issue 27
measured).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from devenv.kafka_cluster import KafkaCluster
from devenv.runners import Pipeline, Runner, produce
from eop_operator.api.load import load_pipeline
from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.api.resolve import resolve_identity
from eop_operator.health.keep_alive import refresh_suspended_progress
from eop_operator.health.progress import KafkaAccess, read_offsets
from tests.plugins.kafka import SHORT_RETENTION_S
from tests.spark_apps.runs import assert_exactly_once

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

#: The broker's retention: the smallest Kafka accepts.
RETENTION_S = SHORT_RETENTION_S
#: How long the pipelines idle: past the retention and the broker's next expiry check.
IDLE_S = RETENTION_S + 20
RECORDS = 300
PARTITIONS = 3


def _pipeline(broker: KafkaCluster, work: Path, name: str) -> Pipeline:
    source, sink = f"in-{name}", f"out-{name}"
    broker.create_topic(source, PARTITIONS)
    broker.create_topic(sink, PARTITIONS)
    work.mkdir(parents=True)
    pipeline = Pipeline(broker=broker, work=work, source_topic=source, sink_topic=sink)
    keys = [(f"{name}-{i}", f"v{i}", i % PARTITIONS) for i in range(RECORDS)]
    produce(broker, source, keys)
    return pipeline


def _model(pipeline: Pipeline, mode: str) -> ExactlyOncePipeline:
    """The operator's view of a test pipeline (same identity: ``test.<name>``)."""
    bootstrap = pipeline.broker.bootstrap_servers
    source = {"bootstrapServers": bootstrap, "topics": [pipeline.source_topic]}
    return load_pipeline(
        {
            "apiVersion": "exactlyonce.io/v1alpha1",
            "kind": "ExactlyOncePipeline",
            "metadata": {"name": pipeline.name, "namespace": "test", "uid": "u", "generation": 1},
            "spec": {
                "source": {"kafka": source},
                "transform": {"sql": "SELECT key, value FROM source"},
                "sink": {
                    "kafka": {
                        "bootstrapServers": bootstrap,
                        "topic": pipeline.sink_topic,
                        "commitMode": mode,
                    }
                },
            },
        }
    )


def _config(pipeline: Pipeline, mode: str, **trigger: Any) -> dict[str, Any]:
    config = pipeline.config()
    config["sink"]["kafka"]["commitMode"] = mode
    if trigger:
        config["trigger"] = trigger
    return config


class Refresher(threading.Thread):
    """Calls the operator's keep-alive for suspended pipelines every retention / 4."""

    def __init__(self, pipelines: list[tuple[KafkaAccess, ExactlyOncePipeline]]) -> None:
        super().__init__(name="operator-keep-alive", daemon=True)
        self.pipelines = pipelines
        self.stopped = threading.Event()
        #: How many partitions each refresh re-committed.
        self.refreshed: list[int] = []

    def run(self) -> None:
        while not self.stopped.is_set():
            for access, pipeline in self.pipelines:
                identity = resolve_identity(pipeline)
                self.refreshed.append(len(refresh_suspended_progress(access, pipeline, identity)))
            self.stopped.wait(RETENTION_S / 4)

    def stop(self) -> None:
        self.stopped.set()
        self.join(60)


def _access(pipeline: Pipeline) -> KafkaAccess:
    """The operator's access to the pipeline's cluster (source and sink)."""
    config = pipeline.broker.client_config()
    return KafkaAccess(source=config, sink=config)


def _wait_caught_up(pipelines: list[Pipeline], runners: list[Runner], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.caught_up() for p in pipelines):
        for runner in runners:
            assert runner.alive or runner.proc.returncode == 0, runner.tail()
        assert time.monotonic() < deadline, [r.tail(10) for r in runners]
        time.sleep(1)


def test_progress_survives_idle_and_suspended_pipelines_past_retention(
    short_retention_cluster: KafkaCluster, spark_jars: list[Path], tmp_path: Path
) -> None:
    cluster = short_retention_cluster
    modes = ["partitioned", "coordinated"]
    idle = [_pipeline(cluster, tmp_path / f"idle-{m}", f"idle-{m[:4]}") for m in modes]
    suspended = [_pipeline(cluster, tmp_path / f"susp-{m}", f"susp-{m[:4]}") for m in modes]
    everyone = idle + suspended
    try:
        # Generation 0: the idle ones keep running, the suspended ones process and exit.
        runners = [p.start(_config(p, m)) for p, m in zip(idle, modes, strict=True)]
        finished = [
            p.start(_config(p, m, availableNow=True)) for p, m in zip(suspended, modes, strict=True)
        ]
        for runner in finished:
            assert runner.wait(240) == 0, runner.tail()
        models = {p.name: _model(p, m) for p, m in zip(idle + suspended, modes * 2, strict=True)}
        # No runner for the suspended ones: the operator's function refreshes them as often
        # as its daemon would (retention / 4) until their new generation starts.
        operator = Refresher([(_access(p), models[p.name]) for p in suspended])
        operator.start()
        _wait_caught_up(everyone, runners, 240)
        time.sleep(IDLE_S)  # past the retention
        for runner in runners:
            assert runner.alive, runner.tail()
            assert any("refreshed" in m for m in runner.messages()), runner.tail()

        # The status's lag stays truthful while idle: G is there, no phantom lag.
        for pipeline in everyone:
            observed = read_offsets(_access(pipeline), models[pipeline.name], pipeline.group)
            expected = [RECORDS // PARTITIONS] * PARTITIONS
            assert [p.committed for p in observed] == expected, pipeline.work.name
            assert sum(p.lag for p in observed) == 0

        # Input after the refreshes (which fenced the producers partitioned tasks keep).
        for pipeline in idle:
            name = pipeline.source_topic.removeprefix("in-")
            late = [(f"{name}-{i}", f"v{i}", i % PARTITIONS) for i in range(RECORDS, 2 * RECORDS)]
            produce(pipeline.broker, pipeline.source_topic, late)
        _wait_caught_up(idle, runners, 120)
        for runner in runners:
            runner.terminate()
            assert runner.wait(120) == 0, runner.tail()
        operator.stop()
        assert operator.refreshed and set(operator.refreshed) == {PARTITIONS}
        # A new generation of each (what an upgrade, fallback or recovery starts).
        resumed = [
            p.start(_config(p, m, availableNow=True), generation=1)
            for p, m in zip(everyone, modes * 2, strict=True)
        ]
        for runner in resumed:
            assert runner.wait(300) == 0, runner.tail()
        for pipeline in everyone:
            name = pipeline.source_topic.removeprefix("in-")
            records = 2 * RECORDS if pipeline in idle else RECORDS
            assert_exactly_once(pipeline.output(), [f"{name}-{i}" for i in range(records)])
    finally:
        for pipeline in everyone:
            pipeline.cleanup()
