"""Scale-out on the multi-node local cluster: executors on several nodes, checkpoints in S3,
node loss survived exactly once.

One cluster of 3 nodes (``nodes_e2e``) for the module, the operator installed from the chart
on the pod network (in-cluster config through the ``kubernetes`` Service: kube-proxy), the
session's Kafka broker and SeaweedFS server on the machine's loopback, reached by pods through
the cluster's gateway. Pipelines run ``spark.master: k8s://https://kubernetes.default.svc``
(cluster DNS) with two executors and their checkpoint in a bucket, in a namespace that
enforces Pod Security's ``restricted`` profile: the drivers and the executor pods Spark
creates are admitted there, or the pipelines would not run at all.

The operator is kept off the drivers' node (a required pod anti-affinity in its chart
values), so that losing a driver's node never loses the operator too: what the status and
the events say afterwards is the operator's own account.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from demo.run import progress_offsets, read_committed
from devenv.kafka import KafkaBroker
from devenv.s3 import S3Server
from eop_operator.reconcile.failover import NODE_LOST
from eop_operator.render.pods import container_security_context, pod_security_context
from tests.e2e.conftest import E2ECluster
from tests.e2e.driver_watch import DriverWatch
from tests.e2e.executor_pods import (
    assert_hardened,
    container_env,
    executor_pods,
    ids_held_by_executors,
    running,
)
from tests.e2e.pipelines_on_nodes import (
    CONTAINER_MEMORY,
    EXECUTORS,
    POD_CPU,
    Check,
    ScaleOut,
    batch_committed_since,
    committed_records,
    first_held,
    node_of,
    restore_lost_nodes,
    scale_out_environment,
    then,
    wait_caught_up,
)
from tests.e2e.records import BurstProducer, exactly_once_failure
from tests.e2e.test_cluster import _driver_pod, _eventually, _get, _produce

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.s3]

#: Apply -> executors Running; a loss -> the pipeline committing again (both on 2 busy cores;
#: with a load of 20 beside the suite, two executors took 2 minutes to register).
START_TIMEOUT = 420.0
RECOVERY_TIMEOUT = 240.0
#: Records written during each disruption: a burst a second for half a minute.
BURSTS, BURST = 30, 30


@pytest.fixture(scope="module")
def scale_out(
    nodes_e2e: E2ECluster,
    kafka_broker: KafkaBroker,
    s3_server: S3Server,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ScaleOut]:
    """The module's operator, namespace, bucket (:func:`scale_out_environment`)."""
    work_dir = tmp_path_factory.mktemp("operator")
    with scale_out_environment(nodes_e2e, kafka_broker, s3_server, work_dir) as environment:
        yield environment


# ----------------------------------------------------------------------------- partitioned


@dataclass
class Wide:
    """The partitioned pipeline of the class, and what was written to it."""

    name: str
    source: str
    sink: str
    watch: DriverWatch
    written: list[tuple[str, str]] = field(default_factory=list)


@pytest.fixture(scope="class")
def wide(scale_out: ScaleOut) -> Iterator[Wide]:
    """A partitioned pipeline with two executors, Running; its driver pods watched from before
    it is applied to its deletion."""
    so, name = scale_out, "wide"
    source, sink = f"so-in-{uuid.uuid4().hex[:6]}", f"so-out-{uuid.uuid4().hex[:6]}"
    so.broker.create_topic(source, 4)
    so.broker.create_topic(sink, 2)
    before = [(f"b{i}", f"v{i}") for i in range(400)]
    _produce(so.broker, source, before)
    watch = DriverWatch(so.cluster, so.ns, name)
    watch.start()
    manifest = so.pipeline(name, source, sink)
    manifest["spec"]["sink"]["kafka"]["commitMode"] = "partitioned"
    began = time.monotonic()
    so.cluster.apply(manifest)
    try:
        _eventually(
            lambda: len(running(executor_pods(so.e2e, so.ns, name))) == EXECUTORS,
            START_TIMEOUT,
            lambda: f"{EXECUTORS} executors Running" + so.diagnostics(name)(),
        )
        print(f"\napplied -> {EXECUTORS} executors Running in {time.monotonic() - began:.1f}s")
        yield Wide(name, source, sink, watch, before)
    finally:
        watch.stop()
        so.cluster.kubectl("delete", "eop", name, "-n", so.ns, "--wait=true", "--timeout=90s")


def _probe_pod(so: ScaleOut, pipeline: str, node: str, driver: tuple[str, int]) -> dict[str, Any]:
    """A pod on ``node`` (eop-spark image) running ``spark_rpc_probe.py`` against ``driver``,
    with the pipeline's RPC key Secret mounted for the client that has the key."""
    script = Path(__file__).with_name("spark_rpc_probe.py")
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "rpc-probe", "namespace": so.ns},
        "data": {script.name: script.read_text()},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rpc-probe", "namespace": so.ns},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            # The namespace enforces Pod Security's restricted profile, as eop's pods pass it.
            "securityContext": pod_security_context(),
            "containers": [
                {
                    "name": "probe",
                    "image": so.e2e.spark_image,
                    "imagePullPolicy": "Never",
                    "command": ["python", f"/probe/{script.name}", driver[0], str(driver[1])],
                    "args": ["--key-file", "/key/key"],
                    "env": [{"name": "HOME", "value": "/tmp"}],
                    "securityContext": container_security_context(),
                    "volumeMounts": [
                        {"name": "probe", "mountPath": "/probe"},
                        {"name": "key", "mountPath": "/key"},
                        {"name": "tmp", "mountPath": "/tmp"},
                    ],
                }
            ],
            "volumes": [
                {"name": "probe", "configMap": {"name": "rpc-probe"}},
                {"name": "key", "secret": {"secretName": f"{pipeline}-spark-rpc"}},
                {"name": "tmp", "emptyDir": {}},
            ],
        },
    }
    so.cluster.apply(config_map, pod)
    done = _eventually(
        lambda: (
            (p := _get(so.e2e, "pod", "rpc-probe", "-n", so.ns))
            and p.get("status", {}).get("phase") in ("Succeeded", "Failed")
            and p
        ),
        240,
        lambda: (
            "the RPC probe pod to finish:\n"
            + so.cluster.kubectl("describe", "pod", "rpc-probe", "-n", so.ns).stdout[-3000:]
        ),
    )
    logs = so.cluster.kubectl("logs", "rpc-probe", "-n", so.ns).stdout
    assert done["status"]["phase"] == "Succeeded", logs[-3000:]
    answers: dict[str, Any] = json.loads(logs.strip().splitlines()[-1])
    return answers


class TestPartitionedOnExecutors:
    """One partitioned pipeline: its executor pods, then three losses in turn."""

    def test_executors_are_hardened_pods_on_two_nodes_and_refuse_a_client_without_the_key(
        self, scale_out: ScaleOut, wide: Wide
    ) -> None:
        so, name = scale_out, wide.name
        labels = _get(so.e2e, "namespace", so.ns)["metadata"]["labels"]
        assert labels.get("pod-security.kubernetes.io/enforce") == "restricted", labels
        pods = running(executor_pods(so.e2e, so.ns, name))
        driver = _driver_pod(so.e2e, so.ns, name)
        nodes = sorted(node_of(p) for p in pods)
        print(f"driver on {node_of(driver)}, executors on {nodes}")
        assert len(set(nodes)) == EXECUTORS, f"executors not spread over nodes: {nodes}"
        for pod in pods:
            assert_hardened(
                pod,
                name,
                driver_uid=driver["metadata"]["uid"],
                cpu=POD_CPU,
                memory=CONTAINER_MEMORY,
            )
        # The executors reach the driver at its pod IP, on the pod network's fixed port.
        url = container_env(pods[0])["SPARK_DRIVER_URL"]["value"]  # spark://Name@host:port
        host, port = url.rsplit("@", 1)[1].rsplit(":", 1)
        assert host == driver["status"]["podIP"] and port == "7078", url
        status = _eventually(
            lambda: (s := so.status(name)).get("executors") == EXECUTORS and s,
            120,
            lambda: "status.executors" + so.diagnostics(name)(),
        )
        assert status["executorSelector"].endswith(f"exactlyonce.io/pipeline={name}")

        # A pod of another node: refused without the key and with a wrong one, let in with it.
        other = next(n.name for n in so.cluster.nodes() if n.name != node_of(driver))
        began = time.monotonic()
        answers = _probe_pod(so, name, other, (host, int(port)))
        print(
            f"Spark RPC at {host}:{port} from {other} ({time.monotonic() - began:.0f}s): {answers}"
        )
        assert answers["the key"] is None, answers
        assert answers["no key"] is not None and answers["wrong key"] is not None, answers

    def test_survives_an_executor_pod_an_executors_node_and_the_drivers_node_lost(
        self, scale_out: ScaleOut, wide: Wide
    ) -> None:
        so, name = scale_out, wide.name
        cluster = so.cluster
        diagnostics = so.diagnostics(name)
        operator_node = node_of(_get(so.e2e, "pod", so.operator[1], "-n", f"{so.ns}-ops"))

        def disrupted(what: str, disrupt: Callable[[], object], **recovered: Check) -> None:
            """Write records throughout; ``disrupt`` once output of them commits; wait until
            each of ``recovered`` held once and a batch committed; then every record exactly
            once. Prints the seconds from the disruption to each."""
            offset = len(wide.written)
            records = [(f"{what}{i}", f"v{offset + i}") for i in range(BURSTS * BURST)]
            group = f"eop.{so.ns}.{name}"
            before = progress_offsets(so.broker, group, wide.source)
            producer = BurstProducer(so.broker, wide.source, records, bursts=BURSTS, pause=1.0)
            producer.start()
            _eventually(
                batch_committed_since(so.broker, group, wide.source, before),
                RECOVERY_TIMEOUT,
                lambda: f"output of the records before {what}" + diagnostics(),
            )
            at_loss = progress_offsets(so.broker, group, wide.source)
            began = time.monotonic()
            disrupt()
            committed = batch_committed_since(so.broker, group, wide.source, at_loss)
            times = first_held(
                {"batch committed": committed, **recovered},
                RECOVERY_TIMEOUT,
                lambda: f"recovery from {what}" + diagnostics(),
                since=began,
            )
            producer.finish(120)
            wide.written += records
            times["caught up"] = (
                time.monotonic() - began + wait_caught_up(so, name, wide.source, RECOVERY_TIMEOUT)
            )
            failure = exactly_once_failure(read_committed(so.broker, wide.sink), wide.written)
            assert failure is None, f"after {what}: {failure}" + diagnostics()
            assert wide.watch.most_running <= 1, f"two drivers at once by the end of {what}:\n" + (
                wide.watch.timeline()
            )
            restore_lost_nodes(cluster)
            seconds = ", ".join(f"{k} {v:.1f}" for k, v in times.items())
            print(f"{what}: {len(wide.written)} records exactly once; seconds after: {seconds}")

        def executors_running(not_owned_by: str = "", gone: frozenset[str] = frozenset()) -> Check:
            """Two executors run, none of ``gone``, none owned by driver pod ``not_owned_by``."""

            def check() -> bool:
                pods = running(executor_pods(so.e2e, so.ns, name))
                names = {p["metadata"]["name"] for p in pods}
                owners = {o["uid"] for p in pods for o in p["metadata"]["ownerReferences"]}
                return len(pods) == EXECUTORS and not gone & names and not_owned_by not in owners

            return check

        # (a) An executor pod dies (force-deleted: no grace, as the OOM killer or a crash).
        pods = running(executor_pods(so.e2e, so.ns, name))
        victim = pods[0]["metadata"]["name"]
        disrupted(
            "executor-pod",
            lambda: cluster.kubectl(
                "delete", "pod", victim, "-n", so.ns, "--grace-period=0", "--force", check=True
            ),
            executor_replaced=executors_running(gone=frozenset({victim})),
        )

        # (b) The node of an executor is lost (not the driver's; not the operator's if it can).
        driver = _driver_pod(so.e2e, so.ns, name)
        pods = [
            p for p in running(executor_pods(so.e2e, so.ns, name)) if node_of(p) != node_of(driver)
        ]
        assert pods, "every executor runs on the driver's node" + diagnostics()
        pods.sort(key=lambda p: node_of(p) == operator_node)
        lost = node_of(pods[0])
        on_lost = frozenset(
            p["metadata"]["name"] for p in executor_pods(so.e2e, so.ns, name) if node_of(p) == lost
        )
        disrupted(
            "executor-node",
            lambda: cluster.lose_node(lost),
            executor_replaced=executors_running(gone=on_lost),
        )

        # (c) The driver's node is lost: the StatefulSet's pod moves once Kubernetes has deleted
        # the old one, and the new driver resumes the checkpoint generation in the bucket.
        driver = _driver_pod(so.e2e, so.ns, name)
        lost, old = node_of(driver), driver["metadata"]["uid"]
        assert lost != operator_node, "the operator shares the driver's node"

        def committed_from_now() -> Check:
            group = f"eop.{so.ns}.{name}"
            now = progress_offsets(so.broker, group, wide.source)
            return batch_committed_since(so.broker, group, wide.source, now)

        def driver_moved() -> bool:
            pod = _driver_pod(so.e2e, so.ns, name)
            return (
                bool(pod)
                and pod["metadata"]["uid"] != old
                and node_of(pod) != lost
                and pod.get("status", {}).get("phase") == "Running"
            )

        disrupted(
            "driver-node",
            lambda: cluster.lose_node(lost),
            driver_running=driver_moved,
            executors_running=executors_running(not_owned_by=old),
            # The old driver's executors may still commit the batch in flight: a batch of the
            # new driver is one committed after it runs.
            **{"batch committed": then(driver_moved, committed_from_now)},
        )

        # Never two drivers: at any moment at most one pod with a running driver container.
        wide.watch.stop()
        assert wide.watch.most_running <= 1, "two drivers at once:\n" + wide.watch.timeline()
        assert wide.watch.most_running == 1
        drivers = {c.uid: c.node for c in wide.watch.changes if c.running}
        assert len(drivers) == 2 and lost in drivers.values(), wide.watch.timeline()

        # What the status and the events say: one restart, its node lost; the same checkpoint
        # generation throughout (the bucket kept it: no CheckpointLost); two executors.
        status = _eventually(
            lambda: (
                (s := so.status(name)).get("phase") == "Running"
                and s.get("executors") == EXECUTORS
                and s
            ),
            120,
            lambda: "the pipeline Running with its executors" + diagnostics(),
        )
        failover = status.get("failover", {})
        assert failover.get("restarts") == 1 and failover.get("lastReason") == NODE_LOST, status
        assert f"node {lost} was not reporting" in failover.get("lastMessage", ""), status
        assert status["checkpoint"]["generation"] == 0, status
        assert status["checkpoint"]["path"].startswith(f"{so.checkpoint['uri']}/{so.ns}/{name}/")
        events = so.events(name)
        reasons = Counter(reason for reason, _ in events)
        assert reasons["Restarted"] == 1 and not reasons["CheckpointLost"], events
        restarted = next(m for r, m in events if r == "Restarted")
        assert NODE_LOST in restarted and lost in restarted, restarted
        logs = cluster.kubectl("logs", "-n", so.ns, f"{name}-driver-0").stdout
        root = f"{so.checkpoint['uri']}/{so.ns}/{name}"
        assert f"resuming checkpoint {root}/gen-0" in logs, logs[-3000:]
        assert "tasks commit in the executors' JVM" in logs
        held = ids_held_by_executors(
            so.e2e, so.ns, f"eop.{so.ns}.{name}.{wide.source}.", executor_pods(so.e2e, so.ns, name)
        )
        assert held, "no executor logged a transactional producer" + diagnostics()
        print(f"driver pods seen:\n{wide.watch.timeline(wide.watch.changes[0].at)}")


# ----------------------------------------------------------------------------- coordinated


#: The windowed count's input: events 20 ms apart (two minutes: 1-minute windows of 3,000
#: events over 17 campaigns), read 1,000 per batch so the executor loss falls mid-stream
#: (after the first of six batches).
COUNT_EVENTS, PER_BATCH, EVENT_SPACING_MS = 6_000, 1_000, 20


def _impression(impression: str, campaign: str, when: datetime) -> str:
    event_time = when.isoformat().replace("+00:00", "Z")
    return json.dumps(
        {"impression_id": impression, "campaign_id": campaign, "event_time": event_time}
    )


def _impressions() -> tuple[list[tuple[str, str, int]], Counter[tuple[str, str]]]:
    """The count's events (key, JSON, partition) and the exact count per (campaign, minute);
    the last event, two hours later, moves the watermark past every window."""
    base = datetime(2026, 3, 1, tzinfo=UTC)
    expected: Counter[tuple[str, str]] = Counter()
    records = []
    for i in range(COUNT_EVENTS):
        when = base + timedelta(milliseconds=EVENT_SPACING_MS * i)
        campaign = f"c-{(i * 7919) % 17}"
        expected[(campaign, when.replace(second=0, microsecond=0).isoformat())] += 1
        records.append((f"i{i}", _impression(f"i{i}", campaign, when), i % 4))
    records.append(("flush", _impression("flush", "flush", base + timedelta(hours=2)), 0))
    return records, expected


def _driver_log(so: ScaleOut, pipeline: str) -> str:
    """The log of the pipeline's driver container."""
    return str(so.cluster.kubectl("logs", "-n", so.ns, f"{pipeline}-driver-0").stdout)


def _registered_executors(so: ScaleOut, pipeline: str) -> set[str]:
    """The ids of the executors the pipeline's driver logged as registered with it."""
    return set(re.findall(r"Registered executor .* with ID (\d+)", _driver_log(so, pipeline)))


def test_a_windowed_count_on_executors_is_exact_after_an_executor_loss(
    scale_out: ScaleOut,
) -> None:
    """Coordinated mode, stateful: the executors keep the windows' state in the bucket."""
    from confluent_kafka import Producer

    so, name = scale_out, "count"
    source, sink = f"so-events-{uuid.uuid4().hex[:6]}", f"so-counts-{uuid.uuid4().hex[:6]}"
    so.broker.create_topic(source, 4)
    so.broker.create_topic(sink, 2)
    records, expected = _impressions()
    producer = Producer(so.broker.client_config({"enable.idempotence": True}))

    def produce(part: list[tuple[str, str, int]]) -> None:
        for key, value, partition in part:
            producer.produce(source, key=key.encode(), value=value.encode(), partition=partition)
        assert producer.flush(60) == 0

    # The last windows close only after the flush event (the last record): it is written
    # once the driver has acted on the executor's loss, so the loss always falls mid-count.
    produce(records[:-1])
    manifest = so.pipeline(name, source, sink)
    spec = manifest["spec"]
    spec["source"]["kafka"]["maxOffsetsPerTrigger"] = PER_BATCH
    spec["sink"]["kafka"]["commitMode"] = "coordinated"
    spec["transform"] = {
        "python": {"module": "eop_spark.examples.impressions", "function": "count_impressions"},
        "outputMode": "append",
    }
    diagnostics = so.diagnostics(name)
    began = time.monotonic()
    so.cluster.apply(manifest)
    try:
        _eventually(
            lambda: (
                len(running(executor_pods(so.e2e, so.ns, name))) == EXECUTORS
                and committed_records(so.broker, name, so.ns, source) >= PER_BATCH
            ),
            START_TIMEOUT,
            lambda: f"{EXECUTORS} executors and a first batch" + diagnostics(),
        )
        # A Running pod may hold a JVM still starting: lose one the driver counts on, or the
        # driver drops a stranger (logged at INFO) and nothing was lost.
        registered = _eventually(
            lambda: len(ids := _registered_executors(so, name)) == EXECUTORS and ids,
            START_TIMEOUT,
            lambda: f"{EXECUTORS} executors registered with the driver" + diagnostics(),
        )
        committed = committed_records(so.broker, name, so.ns, source)
        assert committed < len(records), "the count finished before an executor could be lost"
        first = {p["metadata"]["name"] for p in running(executor_pods(so.e2e, so.ns, name))}
        lost = min(registered, key=int)
        victim = next(p for p in sorted(first) if p.endswith(f"-exec-{lost}"))
        so.cluster.kubectl(
            "delete", "pod", victim, "-n", so.ns, "--grace-period=0", "--force", check=True
        )
        print(f"\nexecutor {victim} deleted after {committed} of {len(records)} events")
        # The driver stops using the executor: "Disabling executor 1." when the connection
        # dropped first, "Lost executor 1 on ..." when Kubernetes told it first (at its next
        # pod poll). The pod object goes at once, its JVM when the kubelet gets to it: until
        # the driver says so, the executor may still run tasks and nothing was lost. The count
        # cannot finish before the flush event below, so the loss falls mid-count.
        lost_line = rf"(Lost (an )?executor|Disabling executor) {lost}\b"
        _eventually(
            lambda: re.search(lost_line, _driver_log(so, name)),
            RECOVERY_TIMEOUT,
            lambda: f"the driver to count executor {lost} lost" + diagnostics(),
        )
        # The driver asks for a new executor once it has counted the old one lost.
        _eventually(
            lambda: {p["metadata"]["name"] for p in executor_pods(so.e2e, so.ns, name)} - first,
            RECOVERY_TIMEOUT,
            lambda: "the driver to replace the lost executor" + diagnostics(),
        )
        produce(records[-1:])
        wait_caught_up(so, name, source, RECOVERY_TIMEOUT)

        def windows() -> list[tuple[tuple[str, str], int]]:
            found = []
            for _, value in read_committed(so.broker, sink):
                window = json.loads(value)
                start = datetime.fromisoformat(str(window["window_start"])).astimezone(UTC)
                found.append(
                    ((str(window["campaign_id"]), start.isoformat()), window["impressions"])
                )
            return found

        # The last windows close in the batch after the flush event (the watermark moved).
        emitted = _eventually(
            lambda: len(w := windows()) >= len(expected) and w,
            RECOVERY_TIMEOUT,
            lambda: f"{len(expected)} windows counted" + diagnostics(),
        )
        print(f"applied -> every window counted in {time.monotonic() - began:.1f}s")
        got: dict[tuple[str, str], int] = {}
        for key, count in emitted:
            assert key not in got, f"window {key} emitted twice"
            got[key] = int(count)
        assert got == dict(expected), (
            f"{len(got)} windows, {len(expected)} expected; differing: "
            f"{ {k: (got.get(k), n) for k, n in expected.items() if got.get(k) != n} }"
            + diagnostics()
        )
        # The executors wrote the windows' state into the bucket, next to the batches.
        logs = _driver_log(so, name)
        said = [line for line in logs.splitlines() if "xecutor" in line and "eop_spark" not in line]
        print("\n".join(said[-40:]))
        state = so.s3.list_keys(so.bucket, f"pipelines/{so.ns}/{name}/gen-0/state/")
        assert state, so.s3.list_keys(so.bucket, f"pipelines/{so.ns}/{name}/")
        status = so.status(name)
        assert status["commitMode"] == "coordinated" and status["executors"] == EXECUTORS, status
        assert status["checkpoint"]["generation"] == 0, status
    finally:
        so.cluster.kubectl("delete", "eop", name, "-n", so.ns, "--wait=true", "--timeout=90s")
