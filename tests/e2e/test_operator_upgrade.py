"""An operator upgrade on the local cluster, the way docs/install.md says, under load.

The chart is installed at one image tag with the default Spark image derived from it; three
pipelines without ``spec.image`` run, one per ``upgrade.mode``, from one source topic that a
producer writes to throughout. ``helm upgrade --reuse-values --set-string image.tag=NEW`` (the
same images under a second tag) gives an operator that renders every driver differently (its
default Spark image). Each driver restarts in ``last-state`` with reason ``OperatorUpgrade``, at
most ``operatorUpgrade.parallelism`` at once; the sinks, read ``read_committed``, hold every
record exactly once, and the stateful pipeline's counts go on from its state.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from demo.run import SCHEDULING_TIMEOUT
from devenv.cluster import LocalCluster
from devenv.kafka import KafkaBroker
from devenv.processes import QUICK_JVM_OPTIONS
from tests.e2e.conftest import E2ECluster
from tests.e2e.records import BurstProducer, exactly_once_failure
from tests.e2e.test_cluster import (
    CHART,
    _create,
    _eventually,
    _get,
    _operator,
    _pipeline,
    _produce,
    _read_committed,
    _release,
)
from tests.plugins.kafka import TopicFactory

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.kafka]

#: Drivers that may restart at once for the upgrade: fewer than the pipelines, so one waits.
PARALLELISM = 2
#: The keys the stateful pipeline counts.
KEYS = 6
#: Records written before the upgrade, and during it (in bursts).
BEFORE, DURING = 30, 60
#: Three drivers and the operator on the node's 2 cores.
DRIVER_CPU = "400m"
#: The stateful pipeline: a running count per key (its state is the counts so far).
COUNT_SQL = "SELECT key, CAST(count(*) AS STRING) AS value FROM source GROUP BY key"


def _record(i: int) -> tuple[str, str]:
    return f"k{i % KEYS}", f"v{i}"


def _manifests(ns: str, servers: str, source: str, sinks: dict[str, str]) -> list[dict[str, Any]]:
    """One pipeline per upgrade mode, named after it; ``committed-offsets`` counts per key."""
    manifests = []
    for mode, sink in sinks.items():
        manifest = _pipeline(mode, ns, servers, source, sink)
        spec = manifest["spec"]
        spec["upgrade"] = {"mode": mode}
        spec["driver"]["resources"]["requests"]["cpu"] = DRIVER_CPU
        spec["spark"]["conf"] = {"spark.driver.extraJavaOptions": " ".join(QUICK_JVM_OPTIONS)}
        if mode == "committed-offsets":
            # A restart in its own mode would start a new generation without these counts.
            spec["transform"] = {"sql": COUNT_SQL, "outputMode": "update"}
        manifests.append(manifest)
    return manifests


def _counts_failure(seen: list[tuple[str, str]], records: list[tuple[str, str]]) -> str | None:
    """What is wrong with the stateful sink, or None: per key, counts that only grow, the last
    one the number of that key's records (a count starting again from 1 is lost state)."""
    expected: dict[str, int] = defaultdict(int)
    for key, _ in records:
        expected[key] += 1
    counts: dict[str, list[int]] = defaultdict(list)
    for key, value in seen:
        counts[key].append(int(value))
    wrong = {
        key: counts[key]
        for key, total in expected.items()
        if not counts[key]
        or counts[key][-1] != total
        or any(b <= a for a, b in zip(counts[key], counts[key][1:], strict=False))
    }
    return f"counts per key not {dict(expected)}: {wrong}" if wrong else None


@contextlib.contextmanager
def _tagged(cluster: LocalCluster, refs: list[str], tag: str) -> Iterator[list[str]]:
    """Each image ref tagged again as ``tag`` in the node's containerd (the new refs), until
    the end of the block."""
    new = [f"{ref.rsplit(':', 1)[0]}:{tag}" for ref in refs]
    for old, ref in zip(refs, new, strict=True):
        cluster.ctr("images", "tag", "--force", old, ref, check=True)
    try:
        yield new
    finally:
        cluster.ctr("images", "rm", *new)


class UpgradeSampler:
    """The pipelines' statuses, sampled while the upgrade runs."""

    def __init__(self) -> None:
        """Nothing sampled yet."""
        self.most_restarting = 0
        self.waited: set[str] = set()
        self.samples = 0

    def sample(self, items: list[dict[str, Any]]) -> None:
        """Count the operator-upgrade restarts under way in one listing of the pipelines."""
        restarting = 0
        for item in items:
            status = item.get("status") or {}
            if (status.get("upgrade") or {}).get("reason") == "OperatorUpgrade":
                restarting += 1
            if "waiting for a restart slot" in str(status.get("message", "")):
                self.waited.add(item["metadata"]["name"])
        self.most_restarting = max(self.most_restarting, restarting)
        self.samples += 1


def test_an_operator_upgrade_restarts_each_mode_in_last_state_throttled_under_load(
    local_cluster: E2ECluster,
    e2e_namespace: str,
    kafka_broker: KafkaBroker,
    kafka_topic_factory: TopicFactory,
    tmp_path: Path,
) -> None:
    e2e, ns, cluster = local_cluster, e2e_namespace, local_cluster.cluster
    began = time.monotonic()
    source = kafka_topic_factory(2, prefix="e2e-upgrade-in")
    sinks = {
        mode: kafka_topic_factory(2, prefix=f"e2e-upgrade-{mode}")
        for mode in ("last-state", "committed-offsets", "stateless")
    }
    records = [_record(i) for i in range(BEFORE + DURING)]
    _produce(kafka_broker, source, records[:BEFORE])
    # The chart derives the default Spark image from image.tag (as installed without values).
    values = {"defaultPipelineImage": "", "operatorUpgrade": {"parallelism": PARALLELISM}}
    refs = [e2e.operator_image, e2e.spark_image]
    with (
        _tagged(cluster, refs, f"{e2e.tag}-next") as new_refs,
        _operator(e2e, ns, tmp_path, values) as (ops_ns, _),
    ):

        def diagnostics() -> str:
            table = cluster.kubectl("get", "eop,pods", "-n", ns, "-o", "wide").stdout
            events = cluster.kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp")
            logs = cluster.kubectl("logs", "-n", ops_ns, "deploy/" + _release(ns), "--tail=40")
            return f"\n{table}\n--- events:\n{events.stdout[-3000:]}\n--- operator:\n{logs.stdout}"

        def pipelines() -> list[dict[str, Any]]:
            return list(_get(e2e, "eop", "-n", ns).get("items", []))

        def all_ready(items: list[dict[str, Any]]) -> bool:
            conditions = [
                {c["type"]: c["status"] for c in (i.get("status") or {}).get("conditions", [])}
                for i in items
            ]
            return len(items) == len(sinks) and all(c.get("Ready") == "True" for c in conditions)

        _create(e2e, *_manifests(ns, kafka_broker.bootstrap_servers, source, sinks))
        before = _eventually(
            lambda: (items := pipelines()) and all_ready(items) and items,
            SCHEDULING_TIMEOUT * 2,
            lambda: "the three drivers Ready" + diagnostics(),
        )
        # State to keep: the counts of what was written before the upgrade.
        _read_committed(
            kafka_broker,
            sinks["committed-offsets"],
            lambda seen: _counts_failure(seen, records[:BEFORE]) is None,
            timeout=120,
            settle=0,
        )
        print(f"three pipelines Ready and counting after {time.monotonic() - began:.0f}s")
        old = {i["metadata"]["name"]: i["status"] for i in before}
        for status in old.values():
            assert status["renderedBy"], status

        producer = BurstProducer(kafka_broker, source, records[BEFORE:], bursts=20, pause=2.0)
        producer.start()
        upgraded_at = time.monotonic()
        upgrade = cluster.helm(
            "upgrade", _release(ns), str(CHART), "-n", ops_ns, "--reuse-values",
            "--set-string", f"image.tag={e2e.tag}-next", "--wait", "--timeout=120s",
        )  # fmt: skip
        assert upgrade.returncode == 0, upgrade.stderr + diagnostics()
        sampler = UpgradeSampler()

        def upgraded() -> bool:
            items = pipelines()
            sampler.sample(items)
            return all_ready(items) and all(
                (s := i.get("status") or {}).get("specHash")
                != old[i["metadata"]["name"]]["specHash"]
                and not s.get("upgrade")
                for i in items
            )

        _eventually(upgraded, 180, lambda: "every driver restarted" + diagnostics())
        took = time.monotonic() - upgraded_at
        producer.finish(60)
        after = {i["metadata"]["name"]: i for i in pipelines()}
        print(
            f"helm upgrade -> three drivers restarted in {took:.0f}s; at most "
            f"{sampler.most_restarting} at once over {sampler.samples} samples; waited: "
            f"{sorted(sampler.waited)}"
        )

        # Each driver runs the new default Spark image, in the checkpoint generation it had.
        for name, item in after.items():
            driver = _get(e2e, "pod", f"{name}-driver-0", "-n", ns)
            assert driver["spec"]["containers"][0]["image"] == new_refs[1], driver["spec"]
            generation = item["status"]["checkpoint"]["generation"]
            assert generation == old[name]["checkpoint"]["generation"], (name, item["status"])
        # Bounded: never more restarting than the parallelism, and the others waited for it.
        assert sampler.most_restarting <= PARALLELISM, diagnostics()
        assert sampler.waited, "no pipeline waited for a restart slot" + diagnostics()
        # Visible: one OperatorUpgrade restart per pipeline, in last-state.
        events = _get(e2e, "events", "-n", ns, "--field-selector", "reason=Upgrading")["items"]
        why: dict[str, list[str]] = defaultdict(list)
        for event in events:
            why[event["involvedObject"]["name"]] += [event["message"]] * event.get("count", 1)
        for name in after:
            # One restart each.
            assert len(why[name]) == 1, json.dumps(why, indent=1)
            assert why[name][0].startswith("OperatorUpgrade:"), why[name]
            assert "last-state" in why[name][0], why[name]

        # Nothing lost, nothing twice, and the counts went on from the state.
        for mode in ("last-state", "stateless"):
            seen = _read_committed(kafka_broker, sinks[mode], len(records), timeout=90, settle=2)
            failure = exactly_once_failure(seen, records)
            assert failure is None, f"{mode}: {failure}" + diagnostics()
        seen = _read_committed(
            kafka_broker,
            sinks["committed-offsets"],
            lambda seen: _counts_failure(seen, records) is None,
            timeout=60,
            settle=3,
        )
        failure = _counts_failure(seen, records)
        assert failure is None, f"committed-offsets: {failure}" + diagnostics()
        print(f"{len(records)} records exactly once in two sinks, counts intact; "
              f"{time.monotonic() - began:.0f}s in all")  # fmt: skip
