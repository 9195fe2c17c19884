"""``make demo``: two exactly-once pipelines on the local cluster, disrupted mid-stream, verified.

Steps (one progress line each, with elapsed seconds):

1. the local cluster (``devenv.cluster``, images built and imported) and a Kafka broker on
   127.0.0.1 with the topics ``impressions-raw`` (4), ``impressions-clean`` (4) and
   ``campaign-counts`` (4);
2. the operator from ``charts/eop`` (``helm upgrade --install`` into ``eop-system``);
3. ``impressions-clean`` (partitioned commit mode) while a producer thread writes uniquely
   keyed impression events (some invalid or from bots), during which the clean driver pod is
   force-deleted and the clean query is upgraded (a WHERE clause that changes no result);
4. ``impressions-count`` (coordinated commit mode, stateful, output mode update) over the
   clean topic, applied together with the clean pipeline and running next to it;
5. each pipeline's progress group ``eop.<namespace>.<name>`` is awaited until it covers the
   source's end offsets, then the outputs are read back ``read_committed`` and compared with an
   exact recount of what was produced;
6. ``eop verify`` on both pipelines, from the run configs their drivers run (one Spark
   session in this process): each report is printed, and each must be clean.

Both pipelines run at once on the one node: on the host network each driver gets a metrics
host port of its own from the operator and lets Spark pick free ports for the rest (see
``eop_operator.render.ports``), and each asks for half a core (``spec.driver.resources``), so
two drivers and the operator fit on 2 cores.

The count uses the example's SQL version (no watermark, output mode ``update``): every batch
re-emits the counts it changed, so the final count of a (campaign, window) is the last record
with that key (the key is the campaign and the window start), as ``eop verify`` reads it too.
Unlike the watermarked append version it never drops events as "late" when the upstream
pipeline catches up after a disruption, so the recount is exact.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from devenv.cluster import REPO, LocalCluster
from devenv.kafka import KafkaBroker
from devenv.processes import QUICK_JVM_OPTIONS
from eop_spark.examples.impressions import sample_event

if TYPE_CHECKING:
    from eop_spark.contract.run_config import RunConfig

CHART = REPO / "charts" / "eop"
EXAMPLES = REPO / "spark_apps" / "eop_spark" / "examples"
OPERATOR_NAMESPACE = "eop-system"
RELEASE = "eop"
NAMESPACE = "eop-demo"
RAW_TOPIC = "impressions-raw"
CLEAN_TOPIC = "impressions-clean"
COUNT_TOPIC = "campaign-counts"
CLEAN = "impressions-clean"
COUNT = "impressions-count"
#: A clean-query change that alters no result (every id produced is non-empty).
UPGRADE_PREDICATE = "\n  AND length(get_json_object(CAST(value AS STRING), '$.impression_id')) > 0"

_T0 = time.monotonic()


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which and why."""


def step(message: str) -> None:
    """Print one progress line with the seconds since the demo started."""
    print(f"[{time.monotonic() - _T0:6.1f}s] {message}", flush=True)


#: From applying a pipeline (or deleting its pod) to its driver container running: a few
#: seconds (the claim is bound in the scheduler's binding cycle, see
#: devenv/hostpath_provisioner.py); the rest is slack for a busy 2-core machine.
SCHEDULING_TIMEOUT = 60.0
#: What each demo driver asks of the node's 2 cores (Spark itself runs local[1]).
DRIVER_CPU = "500m"


def eventually(
    check: Callable[[], Any],
    timeout: float,
    what: Callable[[], str] | str,
    interval: float = 1.0,
) -> Any:
    """Poll ``check`` until truthy; raise :class:`DemoError` naming ``what`` after ``timeout``.

    ``what`` may be a callable, evaluated only on timeout (to describe the state then).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            detail = what() if callable(what) else what
            raise DemoError(f"timed out after {timeout:.0f}s waiting for {detail}")
        time.sleep(interval)


# ----------------------------------------------------------------------------- events


@dataclass
class Produced:
    """What the producer wrote, for the recount."""

    total: int = 0
    clean_ids: set[str] = field(default_factory=set)
    #: (campaign, window start as epoch seconds) -> valid impressions
    windows: Counter[tuple[str, int]] = field(default_factory=Counter)
    invalid: int = 0


class ProducerThread(threading.Thread):
    """Writes impression events to ``RAW_TOPIC`` at ``rate`` per second for ``duration`` s."""

    def __init__(self, broker: KafkaBroker, rate: int, duration: float, seed: int = 7) -> None:
        """Prepare; nothing is produced until :meth:`start`."""
        super().__init__(name="demo-producer", daemon=True)
        self.broker, self.rate, self.duration = broker, rate, duration
        self.run_id = uuid.uuid4().hex[:6]
        self.rng = random.Random(seed)
        self.produced = Produced()
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        """Ask the thread to stop early (it flushes what it produced)."""
        self._stop_event.set()

    def run(self) -> None:
        """Produce in 10 ms slices until the duration is over; flush; record errors."""
        from confluent_kafka import Producer

        try:
            producer = Producer(
                self.broker.client_config({"enable.idempotence": True, "linger.ms": 20})
            )
            began = time.monotonic()
            n = 0
            while not self._stop_event.is_set():
                elapsed = time.monotonic() - began
                if elapsed >= self.duration:
                    break
                while n < int(elapsed * self.rate) + 1:
                    event, valid = sample_event(self.run_id, n, self.rng)
                    key = event["impression_id"]
                    producer.produce(RAW_TOPIC, key=key.encode(), value=json.dumps(event).encode())
                    if valid:
                        self.produced.clean_ids.add(key)
                        ts = datetime.strptime(event["event_time"], "%Y-%m-%dT%H:%M:%SZ")
                        epoch = int(ts.replace(tzinfo=UTC).timestamp())
                        self.produced.windows[(event["campaign_id"], epoch - epoch % 60)] += 1
                    else:
                        self.produced.invalid += 1
                    n += 1
                producer.poll(0)
                time.sleep(0.01)
            if producer.flush(60) != 0:
                raise DemoError("the producer could not flush its last events in 60s")
            self.produced.total = n
        except BaseException as exc:  # reported by the main thread
            self.error = exc


# ----------------------------------------------------------------------------- kafka


def start_broker(work_dir: Path) -> KafkaBroker:
    """A broker in ``work_dir`` with the demo's three topics."""
    broker = KafkaBroker(work_dir).start()
    for topic in (RAW_TOPIC, CLEAN_TOPIC, COUNT_TOPIC):
        broker.create_topic(topic, 4, exist_ok=True)
    return broker


def end_offsets(broker: KafkaBroker, topic: str) -> dict[int, int]:
    """The read_committed end offset (last stable offset) of each partition of ``topic``."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

    admin = AdminClient(broker.client_config({"log_level": 3}))
    meta = admin.list_topics(topic, timeout=10)
    parts = [TopicPartition(topic, p) for p in meta.topics[topic].partitions]
    futures = admin.list_offsets(
        {tp: OffsetSpec.latest() for tp in parts},  # type: ignore[no-untyped-call]
        isolation_level=IsolationLevel.READ_COMMITTED,
        request_timeout=10,
    )
    return {tp.partition: fut.result().offset for tp, fut in futures.items()}


def progress_offsets(broker: KafkaBroker, group: str, topic: str) -> dict[int, int]:
    """Offsets of ``topic`` committed in ``group`` (require_stable); missing -> absent."""
    from confluent_kafka import (
        ConsumerGroupTopicPartitions,
        KafkaError,
        KafkaException,
        TopicPartition,
    )
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(broker.client_config({"log_level": 3}))
    meta = admin.list_topics(topic, timeout=10)
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, p) for p in meta.topics[topic].partitions]
    )
    deadline = time.monotonic() + 30
    while True:
        futures = admin.list_consumer_group_offsets(
            [request], require_stable=True, request_timeout=10
        )
        try:
            result = futures[group].result()
        except KafkaException as exc:
            # A coordinator still loading its offsets (a broker just started, or the group's
            # partition moved) answers again shortly.
            error = exc.args[0]
            passing = error.retriable() or error.code() in (
                KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                KafkaError.COORDINATOR_NOT_AVAILABLE,
                KafkaError.NOT_COORDINATOR,
            )
            if not passing or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
            continue
        return {tp.partition: tp.offset for tp in result.topic_partitions if tp.offset >= 0}


def wait_caught_up(broker: KafkaBroker, pipeline: str, topic: str, timeout: float) -> None:
    """Wait until ``eop.<ns>.<pipeline>`` has committed the end offset of every partition."""
    group = f"eop.{NAMESPACE}.{pipeline}"
    state: dict[str, Any] = {}

    def caught_up() -> bool:
        try:
            state["end"] = end_offsets(broker, topic)
            state["done"] = progress_offsets(broker, group, topic)
        except Exception as exc:  # a transient admin error: retry
            state["error"] = repr(exc)
            return False
        return all(state["done"].get(p, 0) >= e for p, e in state["end"].items())

    try:
        eventually(caught_up, timeout, f"progress group {group} to reach the end of {topic}", 2)
    except DemoError as exc:
        raise DemoError(
            f"{exc}: end offsets {state.get('end')}, committed {state.get('done')}"
            + (f", last error {state['error']}" if "error" in state else "")
        ) from None


def read_committed(broker: KafkaBroker, topic: str) -> list[tuple[str, str]]:
    """Every record of ``topic`` visible to a read_committed reader (up to the end offsets)."""
    from confluent_kafka import Consumer, TopicPartition

    ends = end_offsets(broker, topic)
    consumer = Consumer(
        broker.client_config(
            {
                "group.id": f"demo-reader-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    records: list[tuple[str, str]] = []
    position = dict.fromkeys(ends, 0)
    deadline = time.monotonic() + 120
    try:
        while any(position[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise DemoError(f"reading {topic}: stuck at {position}, end {ends}")
            for msg in consumer.consume(1000, 1.0):
                if msg.error():
                    continue
                records.append(((msg.key() or b"").decode(), (msg.value() or b"").decode()))
                part, offset = msg.partition(), msg.offset()
                if part is not None and offset is not None:
                    position[part] = offset + 1
            # Transaction markers at the end are never delivered: ask where the reader is.
            for tp in consumer.position([TopicPartition(topic, p) for p in ends]):
                if tp.offset >= 0:
                    position[tp.partition] = max(position[tp.partition], tp.offset)
    finally:
        consumer.close()
    return records


# ----------------------------------------------------------------------------- kubernetes


@dataclass
class Images:
    """The image refs imported into the cluster."""

    operator: str
    spark: str


def bring_up_cluster() -> tuple[LocalCluster, Images]:
    """Start the local cluster (idempotent) and build/import the current images."""
    cluster = LocalCluster()
    cluster.up(images=False)
    refs = cluster.load_images()
    return cluster, Images(refs["operator"], refs["spark"])


def operator_values(cluster: LocalCluster, images: Images, watch: list[str]) -> dict[str, Any]:
    """Chart values for the local cluster: its images, and on the single node (no pod network)
    the host network and the loopback apiserver. The multi-node cluster has a pod network,
    kube-proxy and cluster DNS: the chart's defaults hold there."""
    from devenv.processes import free_port

    values: dict[str, Any] = {
        "image": {
            "repository": images.operator.rsplit(":", 1)[0],
            "tag": images.operator.rsplit(":", 1)[1],
            "pullPolicy": "Never",
        },
        "defaultPipelineImage": images.spark,
        "watchNamespaces": watch,
    }
    if cluster.pod_network:
        return values
    health_port = free_port()
    return values | {
        "hostNetwork": True,
        # No pod network: pipelines run on the node's network too (refused by default).
        "pipelinePolicy": {"allowHostNetwork": True},
        "health": {"port": health_port},
        "metrics": {"port": free_port()},
        "extraArgs": [f"--liveness=http://127.0.0.1:{health_port}/healthz"],
        "extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(cluster.apiserver_port)},
        ],
    }


def _helm_release_status(cluster: LocalCluster) -> str | None:
    """The release's status (``deployed``, ``pending-upgrade``, ...), None when not installed."""
    result = cluster.helm("status", RELEASE, "-n", OPERATOR_NAMESPACE, "-o", "json")
    if result.returncode != 0:
        return None
    return str(json.loads(result.stdout).get("info", {}).get("status", ""))


def install_operator(cluster: LocalCluster, images: Images, work_dir: Path) -> None:
    """Apply the CRD, then ``helm upgrade --install`` the chart and wait for the operator."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"),
                    check=True)  # fmt: skip
    status = _helm_release_status(cluster)
    if status is not None and status.startswith("pending"):
        # A run interrupted in the middle of helm leaves the release locked ("another
        # operation is in progress"); the CRDs and the pipelines stay.
        step(f"helm release {RELEASE} was left {status} by an interrupted run: reinstalling")
        cluster.helm("uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--wait", check=True)
    for ns in (NAMESPACE, OPERATOR_NAMESPACE):
        if cluster.kubectl("get", "namespace", ns).returncode != 0:
            cluster.kubectl("create", "namespace", ns, check=True)
    values = work_dir / "operator-values.json"
    values.write_text(json.dumps(operator_values(cluster, images, [NAMESPACE])))
    result = cluster.helm(
        "upgrade", "--install", RELEASE, str(CHART), "-n", OPERATOR_NAMESPACE, "-f", str(values),
        "--wait", "--timeout=180s",
    )  # fmt: skip
    if result.returncode != 0:
        pods = cluster.kubectl("describe", "pods", "-n", OPERATOR_NAMESPACE).stdout[-3000:]
        raise DemoError(f"helm upgrade --install failed: {result.stderr.strip()}\n{pods}")


def pipeline_manifest(name: str, broker: KafkaBroker, images: Images) -> dict[str, Any]:
    """The example manifest of ``name``, adapted to this cluster and the demo's topics."""
    manifest: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    manifest["metadata"]["namespace"] = NAMESPACE
    spec = manifest["spec"]
    spec["source"]["kafka"]["bootstrapServers"] = broker.bootstrap_servers
    spec["sink"]["kafka"]["bootstrapServers"] = broker.bootstrap_servers
    spec["image"] = images.spark
    spec["imagePullPolicy"] = "Never"
    spec["driver"] = {"hostNetwork": True, "resources": {"requests": {"cpu": DRIVER_CPU}}}
    spec["trigger"] = {"processingTime": "2s"}
    spec["spark"]["master"] = "local[1]"
    spec["spark"]["driver"] = {"cores": 1, "memory": "768m"}
    # Minutes-long drivers on 2 cores: the JVM's quick-start flags (as devenv's JVMs have).
    conf = spec["spark"].setdefault("conf", {})
    conf["spark.driver.extraJavaOptions"] = " ".join(QUICK_JVM_OPTIONS)
    if name == COUNT:
        from eop_spark.examples.impressions import COUNT_IMPRESSIONS_SQL

        spec["source"]["kafka"]["topics"] = [CLEAN_TOPIC]
        spec["sink"]["kafka"]["topic"] = COUNT_TOPIC
        spec["transform"] = {"sql": COUNT_IMPRESSIONS_SQL, "outputMode": "update"}
    else:
        spec["source"]["kafka"]["topics"] = [RAW_TOPIC]
        spec["sink"]["kafka"]["topic"] = CLEAN_TOPIC
    return manifest


def get_json(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    """``kubectl get -o json ARGS`` or ``{}``."""
    result = cluster.kubectl("get", "-o", "json", *args)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def driver_pods(cluster: LocalCluster, pipeline: str) -> list[dict[str, Any]]:
    """The pipeline's driver pods that exist (terminating ones included)."""
    pods = get_json(cluster, "pods", "-n", NAMESPACE, "-l", f"exactlyonce.io/pipeline={pipeline}")
    return [p for p in pods.get("items", []) if "-driver-" in p["metadata"]["name"]]


def running_driver(cluster: LocalCluster, pipeline: str) -> dict[str, Any] | None:
    """The driver pod if exactly one exists, not terminating, with its container running."""
    pods = driver_pods(cluster, pipeline)
    if len(pods) != 1 or pods[0]["metadata"].get("deletionTimestamp"):
        return None
    statuses = pods[0].get("status", {}).get("containerStatuses", [])
    if statuses and "running" in statuses[0].get("state", {}):
        return pods[0]
    return None


class PodSampler(threading.Thread):
    """Samples a pipeline's driver pods every 0.5 s; records the most seen at once."""

    def __init__(self, cluster: LocalCluster, pipeline: str) -> None:
        """Prepare; sampling starts with :meth:`start`."""
        super().__init__(name=f"sampler-{pipeline}", daemon=True)
        self.cluster, self.pipeline = cluster, pipeline
        self.max_seen = 0
        self.samples = 0
        self._stop_event = threading.Event()

    def stop(self) -> None:
        """Stop sampling and wait for the thread."""
        self._stop_event.set()
        self.join(10)

    def run(self) -> None:
        """Sample until stopped."""
        while not self._stop_event.wait(0.5):
            pods = [
                p for p in driver_pods(self.cluster, self.pipeline)
                if p.get("status", {}).get("phase") in ("Pending", "Running")
            ]  # fmt: skip
            self.max_seen = max(self.max_seen, len(pods))
            self.samples += 1


def wait_driver(cluster: LocalCluster, pipeline: str, timeout: float, not_uid: str = "") -> str:
    """Wait for a running driver pod (other than ``not_uid``); return its uid."""
    pod = eventually(
        lambda: (p := running_driver(cluster, pipeline)) and p["metadata"]["uid"] != not_uid and p,
        timeout,
        f"a running driver of {pipeline}"
        + (f" other than {not_uid[:8]}" if not_uid else "")
        + f"; pods: {[p['metadata']['name'] for p in driver_pods(cluster, pipeline)]}",
    )
    return str(pod["metadata"]["uid"])


def kill_driver_pod(
    cluster: LocalCluster, pipeline: str, timeout: float = SCHEDULING_TIMEOUT
) -> float:
    """Force-delete the driver pod; wait for its replacement to run; return the seconds taken."""
    began = time.monotonic()
    old = wait_driver(cluster, pipeline, 60)
    cluster.kubectl("delete", "pod", f"{pipeline}-driver-0", "-n", NAMESPACE,
                    "--grace-period=0", "--force", check=True)  # fmt: skip
    wait_driver(cluster, pipeline, timeout, not_uid=old)
    return time.monotonic() - began


def kill_driver_container(
    cluster: LocalCluster, pipeline: str, timeout: float = SCHEDULING_TIMEOUT
) -> float:
    """SIGKILL the driver container through containerd; wait until it runs again."""
    began = time.monotonic()
    restarts = 0
    refusals: list[str] = []

    def killed() -> bool:
        # The pod's status can lag its container by a moment (a container that has just
        # exited or been replaced still shows as running): ctr then finds no task, and
        # the next status read names the container to kill.
        nonlocal restarts
        pod = running_driver(cluster, pipeline)
        if pod is None:
            return False
        status = pod["status"]["containerStatuses"][0]
        container_id = status["containerID"].split("://", 1)[1]
        restarts = int(status.get("restartCount", 0))
        result = cluster.ctr("task", "kill", "-s", "SIGKILL", container_id)
        if result.returncode != 0:
            refusals.append(f"{container_id[:12]}: {result.stderr.strip()}")
        return result.returncode == 0

    eventually(
        killed,
        60,
        lambda: f"a {pipeline} driver container to SIGKILL; ctr said: {refusals[-3:]}",
    )
    if refusals:
        step(f"ctr found no task {len(refusals)} time(s) before the kill: {refusals[-1]}")

    def restarted() -> bool:
        p = running_driver(cluster, pipeline)
        return p is not None and int(p["status"]["containerStatuses"][0]["restartCount"]) > restarts

    eventually(restarted, timeout, f"the {pipeline} driver container to restart")
    return time.monotonic() - began


def kill_operator_mid_upgrade(cluster: LocalCluster, pipeline: str, timeout: float = 180) -> None:
    """Force-delete the operator pod while ``pipeline``'s upgrade is in flight (status.upgrade)."""

    selector = f"app.kubernetes.io/instance={RELEASE}"

    def status() -> dict[str, Any]:
        found: dict[str, Any] = get_json(cluster, "eop", pipeline, "-n", NAMESPACE).get(
            "status", {}
        )
        return found

    def not_started() -> str:
        logs = cluster.kubectl("logs", "-n", OPERATOR_NAMESPACE, "-l", selector, "--tail=30")
        return (
            f"{pipeline}'s upgrade to start; its status: {json.dumps(status())}\n"
            f"the operator's log:\n{logs.stdout}{logs.stderr}"
        )

    eventually(lambda: status().get("upgrade"), timeout, not_started, interval=0.2)
    cluster.kubectl("delete", "pod", "-n", OPERATOR_NAMESPACE, "-l", selector,
                    "--grace-period=0", "--force", check=True)  # fmt: skip


def upgrade_clean_query(
    cluster: LocalCluster, timeout: float = 240, *, kill_operator: bool = False
) -> float:
    """Change the clean pipeline's WHERE (same results); wait for the new driver to run.

    With ``kill_operator`` the operator pod is force-deleted in the middle of the upgrade: its
    replacement must finish the upgrade from the write-ahead log in the pipeline's status.
    """
    began = time.monotonic()
    old = wait_driver(cluster, CLEAN, 60)
    current = get_json(cluster, "eop", CLEAN, "-n", NAMESPACE)
    sql = current["spec"]["transform"]["sql"].rstrip() + UPGRADE_PREDICATE + "\n"
    patch = json.dumps({"spec": {"transform": {"sql": sql}}})
    cluster.kubectl("patch", "eop", CLEAN, "-n", NAMESPACE, "--type=merge", "-p", patch,
                    check=True)  # fmt: skip
    if kill_operator:
        kill_operator_mid_upgrade(cluster, CLEAN)
    wait_driver(cluster, CLEAN, timeout, not_uid=old)
    return time.monotonic() - began


# ----------------------------------------------------------------------------- verification


@dataclass
class Verification:
    """The numbers of the final table."""

    produced: int
    expected_clean: int
    clean_records: int
    duplicates: int
    missing: int
    unexpected: int
    count_duplicate_keys: int
    per_campaign: dict[str, tuple[int, int]]  # campaign -> (expected, counted)
    window_diffs: int
    windows: int

    @property
    def ok(self) -> bool:
        """Whether every difference is zero."""
        return self.duplicates == self.missing == self.unexpected == self.window_diffs == 0 and all(
            e == c for e, c in self.per_campaign.values()
        )

    def table(self) -> str:
        """The verification table as text."""
        rows = [
            ("events produced to " + RAW_TOPIC, self.produced, ""),
            ("expected clean events (valid)", self.expected_clean, ""),
            ("records in " + CLEAN_TOPIC + " (read_committed)", self.clean_records,
             self.clean_records - self.expected_clean),
            ("duplicate clean records", self.duplicates, self.duplicates),
            ("missing clean records", self.missing, self.missing),
            ("unexpected clean records", self.unexpected, self.unexpected),
            ("(campaign, minute) windows expected", self.windows, ""),
            ("windows whose last count differs", self.window_diffs, self.window_diffs),
        ]  # fmt: skip
        lines = [f"{'':2}{'check':<52}{'value':>10}{'diff':>8}", "  " + "-" * 70]
        lines += [f"  {name:<52}{value:>10}{diff!s:>8}" for name, value, diff in rows]
        lines += ["", f"  {'campaign':<12}{'recount':>10}{'counted':>10}{'diff':>8}"]
        for campaign, (expected, counted) in sorted(self.per_campaign.items()):
            lines.append(f"  {campaign:<12}{expected:>10}{counted:>10}{counted - expected:>8}")
        return "\n".join(lines)


def window_epoch(text: str) -> int:
    """Epoch seconds of a Spark ``to_json`` timestamp such as ``2026-05-01T10:00:00.000Z``."""
    return int(datetime.fromisoformat(text).timestamp())


def last_counts(records: list[tuple[str, str]]) -> dict[tuple[str, int], int]:
    """Update mode: the last count per (campaign, window start)."""
    last: dict[tuple[str, int], int] = {}
    for _key, value in records:
        row = json.loads(value)
        last[(row["campaign_id"], window_epoch(row["window_start"]))] = int(row["impressions"])
    return last


def verify(broker: KafkaBroker, produced: Produced) -> Verification:
    """Read both output topics read_committed and compare them with the recount."""
    clean = read_committed(broker, CLEAN_TOPIC)
    keys = Counter(k for k, _ in clean)
    counts = last_counts(read_committed(broker, COUNT_TOPIC))
    expected = produced.windows
    per_campaign: dict[str, tuple[int, int]] = {}
    for campaign in sorted({c for c, _ in expected} | {c for c, _ in counts}):
        e = sum(n for (c, _), n in expected.items() if c == campaign)
        got = sum(n for (c, _), n in counts.items() if c == campaign)
        per_campaign[campaign] = (e, got)
    diffs = sum(1 for k in set(expected) | set(counts) if expected.get(k, 0) != counts.get(k, 0))
    return Verification(
        produced=produced.total,
        expected_clean=len(produced.clean_ids),
        clean_records=len(clean),
        duplicates=sum(n - 1 for n in keys.values()),
        missing=len(produced.clean_ids - set(keys)),
        unexpected=len(set(keys) - produced.clean_ids),
        count_duplicate_keys=0,
        per_campaign=per_campaign,
        window_diffs=diffs,
        windows=len(expected),
    )


# ----------------------------------------------------------------------------- scenario


@dataclass
class Outcome:
    """What a scenario run observed."""

    verification: Verification
    max_clean_drivers: int
    max_count_drivers: int
    disruptions: list[str]


def run_config(cluster: LocalCluster, pipeline: str) -> RunConfig:
    """The run config the operator wrote for ``pipeline``'s driver: ConfigMap
    ``<name>-config``, key ``run.json`` (``eop_operator.render.naming.config_map_name``)."""
    from eop_spark.contract.run_config import CONFIG_FILE_NAME, RunConfig

    data = get_json(cluster, "configmap", f"{pipeline}-config", "-n", NAMESPACE).get("data", {})
    if CONFIG_FILE_NAME not in data:
        raise DemoError(f"no {CONFIG_FILE_NAME} in the ConfigMap {NAMESPACE}/{pipeline}-config")
    return RunConfig.model_validate_json(data[CONFIG_FILE_NAME])


def eop_verify(cluster: LocalCluster) -> dict[str, tuple[int, str]]:
    """``eop verify`` on both pipelines in one Spark session of this process: the exit code and
    the report of each (printed too).

    The drivers run on the host network, so their run configs' bootstrap servers (the broker
    on loopback) answer here.  The session has two cores: the drivers are idle by now.
    """
    import io

    from devenv.kafka import spark_kafka_jars
    from eop_spark.runtime.session import build_session
    from eop_spark.verify.recount import run_verify

    configs = {name: run_config(cluster, name) for name in (CLEAN, COUNT)}
    first = configs[CLEAN]
    local = first.model_copy(
        update={"spark": first.spark.model_copy(update={"master": "local[2]"})}
    )
    # A SparkContext replaces the SIGINT handler with one that fails once it is stopped: put
    # Python's back, so that Ctrl-C still stops the demo's last steps.
    sigint = signal.getsignal(signal.SIGINT)
    began = time.monotonic()
    spark = build_session(local, spark_kafka_jars())
    step(f"eop verify: Spark session started in {time.monotonic() - began:.1f}s")
    results: dict[str, tuple[int, str]] = {}
    try:
        for name, config in configs.items():
            out = io.StringIO()
            code = run_verify(config, spark=spark, out=out)
            results[name] = (code, out.getvalue())
            print(
                f"\n--- eop verify {NAMESPACE}/{name} (exit {code})\n{out.getvalue()}", flush=True
            )
    finally:
        spark.stop()
        signal.signal(signal.SIGINT, sigint)
    step(f"eop verify: both pipelines checked in {time.monotonic() - began:.1f}s")
    return results


def remove_previous_run(cluster: LocalCluster, timeout: float = 180.0) -> None:
    """Delete a previous run's pipelines, driver pods and checkpoints, and wait until gone.

    A previous run (finished, failed or interrupted) leaves its pipelines running
    against its broker, which is gone, and their checkpoint claims, which name
    offsets of that broker.  Each claim stays until no pod uses it: the new
    pipelines are applied only once all of it is gone, or their drivers would
    wait for claims that are being deleted.
    """
    if cluster.kubectl("get", "namespace", NAMESPACE).returncode != 0:
        return
    names = (CLEAN, COUNT)
    for name in names:
        cluster.kubectl("delete", "eop", name, "-n", NAMESPACE, "--ignore-not-found",
                        "--wait=true", f"--timeout={timeout:.0f}s")  # fmt: skip
    # Their broker is gone: nothing is in flight that a graceful stop would commit.
    for name in names:
        for pod in driver_pods(cluster, name):
            cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", NAMESPACE,
                            "--grace-period=0", "--force", "--ignore-not-found")  # fmt: skip
    eventually(
        lambda: not any(driver_pods(cluster, name) for name in names),
        timeout,
        lambda: (
            "the previous run's driver pods to go: "
            + str([p["metadata"]["name"] for n in names for p in driver_pods(cluster, n)])
        ),
    )
    for name in names:
        result = cluster.kubectl("delete", "pvc", f"{name}-checkpoint", "-n", NAMESPACE,
                                 "--ignore-not-found", "--wait=true", f"--timeout={timeout:.0f}s",
                                 timeout=timeout + 30)  # fmt: skip
        if result.returncode != 0:
            raise DemoError(f"the previous run's claim {name}-checkpoint: {result.stderr.strip()}")


def remove_workloads(cluster: LocalCluster) -> None:
    """Delete the demo's pipelines before the cluster goes down, so that nothing of it runs again.

    The cluster keeps its data when it stops: without this, the next start (``make test``,
    ``make cluster-up``) would bring the demo's drivers back, holding a core of the node
    against a broker that is gone. A second Ctrl-C skips it; the next demo removes what is
    left (:func:`remove_previous_run`), and so does the end-to-end tier when it starts the
    cluster.
    """
    try:
        remove_previous_run(cluster, timeout=60.0)
        step(f"pipelines of {NAMESPACE} deleted")
    except KeyboardInterrupt:
        step(f"interrupted: the pipelines of {NAMESPACE} stay until the next run removes them")
    except DemoError as exc:
        step(f"the pipelines of {NAMESPACE} could not all be deleted: {exc}")


def run_scenario(
    cluster: LocalCluster,
    broker: KafkaBroker,
    images: Images,
    *,
    rate: int = 1000,
    duration: float = 45.0,
    container_kill: bool = False,
    operator_kill: bool = False,
    drain_timeout: float = 300.0,
) -> Outcome:
    """Apply the pipelines, produce, disrupt, drain and verify (cluster and operator ready)."""
    remove_previous_run(cluster)
    began = time.monotonic()
    cluster.apply(*(pipeline_manifest(name, broker, images) for name in (CLEAN, COUNT)))
    for name in (CLEAN, COUNT):
        wait_driver(cluster, name, SCHEDULING_TIMEOUT)
        step(f"{name} driver running ({time.monotonic() - began:.1f}s after apply)")
    sampler, count_sampler = PodSampler(cluster, CLEAN), PodSampler(cluster, COUNT)
    sampler.start()
    count_sampler.start()
    producer = ProducerThread(broker, rate, duration)
    producer.start()
    step(f"producer started: ~{rate}/s for {duration:.0f}s into {RAW_TOPIC}")
    disruptions = []
    time.sleep(min(15.0, duration / 5))
    took = kill_driver_pod(cluster, CLEAN)
    disruptions.append(f"force-deleted {CLEAN}-driver-0: replacement running in {took:.1f}s")
    step(disruptions[-1])
    if container_kill:
        took = kill_driver_container(cluster, CLEAN)
        disruptions.append(f"SIGKILLed the {CLEAN} driver container: restarted in {took:.1f}s")
        step(disruptions[-1])
    took = upgrade_clean_query(cluster, kill_operator=operator_kill)
    killed = ", operator pod force-deleted mid-upgrade" if operator_kill else ""
    disruptions.append(
        f"upgraded the {CLEAN} query (extra WHERE{killed}): new driver in {took:.1f}s"
    )
    step(disruptions[-1])
    producer.join(duration + 120)
    if producer.error is not None:
        raise DemoError(f"the producer failed: {producer.error!r}")
    step(f"producer done: {producer.produced.total} events ({producer.produced.invalid} invalid)")
    wait_caught_up(broker, CLEAN, RAW_TOPIC, drain_timeout)
    sampler.stop()
    step(f"{CLEAN}: progress group eop.{NAMESPACE}.{CLEAN} at the end of {RAW_TOPIC}")
    # The count ran next to the clean pipeline all along; it drains what the clean one wrote.
    wait_caught_up(broker, COUNT, CLEAN_TOPIC, drain_timeout)
    count_sampler.stop()
    step(f"{COUNT}: progress group eop.{NAMESPACE}.{COUNT} at the end of {CLEAN_TOPIC}")
    verification = verify(broker, producer.produced)
    return Outcome(verification, sampler.max_seen, count_sampler.max_seen, disruptions)


def explain_failure(cluster: LocalCluster) -> None:
    """Print, on stderr, what a failed run leaves to explain it: the pipelines and pods, each
    pipeline's Ready message, a node condition that stops pods (disk or memory pressure: the
    kubelet then evicts them) and the latest warning events."""
    print(cluster.kubectl("get", "eop,pods", "-A").stdout, file=sys.stderr)
    for item in get_json(cluster, "eop", "-A").get("items", []):
        ready = [c for c in item.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
        why = ready[0].get("message", "") if ready else "no status yet"
        print(f"{item['metadata']['name']}: {why}", file=sys.stderr)
    for node in get_json(cluster, "nodes").get("items", []):
        for condition in node.get("status", {}).get("conditions", []):
            if condition["type"] != "Ready" and condition["status"] == "True":
                print(
                    f"node {node['metadata']['name']}: {condition['type']}: "
                    f"{condition.get('message', '')}",
                    file=sys.stderr,
                )
    events = cluster.kubectl(
        "get", "events", "-A", "--field-selector=type=Warning", "--sort-by=.lastTimestamp"
    ).stdout.splitlines()
    if len(events) > 1:
        print("\n".join(["latest warnings:", events[0], *events[1:][-10:]]), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the whole demo; 0 when every difference is zero."""
    parser = argparse.ArgumentParser(prog="python -m demo.run", description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the cluster and broker up")
    parser.add_argument("--rate", type=int, default=1000, help="events per second")
    parser.add_argument("--duration", type=float, default=45.0, help="seconds of producing")
    parser.add_argument("--work-dir", type=Path, default=None, help="broker dir (default: temp)")
    args = parser.parse_args(argv)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="eop-demo-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    temporary = args.work_dir is None
    cluster: LocalCluster | None = None
    broker: KafkaBroker | None = None
    code = 1
    try:
        step("bringing up the local cluster and the images (cached after the first run)")
        cluster, images = bring_up_cluster()
        step(f"cluster ready; images {images.operator} {images.spark}")
        broker = start_broker(work_dir / "kafka")
        step(f"Kafka broker on {broker.bootstrap_servers}; topics {RAW_TOPIC}, {CLEAN_TOPIC}, "
             f"{COUNT_TOPIC}")  # fmt: skip
        install_operator(cluster, images, work_dir)
        step(f"operator installed (helm release {RELEASE} in {OPERATOR_NAMESPACE}) and Ready")
        outcome = run_scenario(cluster, broker, images, rate=args.rate, duration=args.duration)
        v = outcome.verification
        print("\n" + v.table() + "\n", flush=True)
        print(f"  most {CLEAN} driver pods at once: {outcome.max_clean_drivers}; "
              f"{COUNT}: {outcome.max_count_drivers}\n")  # fmt: skip
        print(cluster.kubectl("get", "eop", "-A").stdout, flush=True)
        step("eop verify on both pipelines (their run configs, one Spark session)")
        codes = {name: code for name, (code, _) in eop_verify(cluster).items()}
        if not (v.ok and outcome.max_clean_drivers <= 1 and outcome.max_count_drivers <= 1):
            step("FAIL: the outputs differ from the recount (see the table above)")
        elif any(codes.values()):
            step("FAIL: eop verify found the sinks differ from its recount (see its reports)")
        else:
            step("PASS: exactly once - no duplicates, nothing missing, every count exact")
            code = 0
    except KeyboardInterrupt:
        step("interrupted: stopping the broker and the cluster (the next run starts clean)")
        code = 130
    except Exception as exc:  # DemoError and anything unexpected: one clear line
        step(f"FAIL: {exc}")
        if cluster is not None:
            explain_failure(cluster)
    finally:
        if args.keep and cluster is not None:
            step(f"--keep: cluster up, KUBECONFIG={cluster.kubeconfig}")
            if broker is not None:
                step(
                    f"--keep: Kafka on {broker.bootstrap_servers} (dir {broker.work_dir}); "
                    "Ctrl-C stops it; `python -m devenv.cluster down` stops the cluster"
                )
                with contextlib.suppress(KeyboardInterrupt):
                    while broker.running:
                        time.sleep(1)
                broker.stop()
        else:
            if cluster is not None:
                remove_workloads(cluster)
            if broker is not None:
                broker.stop()
                step("Kafka broker stopped")
            if temporary:
                shutil.rmtree(work_dir, ignore_errors=True)
            if cluster is not None:
                cluster.down()
                step("cluster down")
    return code


if __name__ == "__main__":
    sys.exit(main())
