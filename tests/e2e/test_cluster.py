"""End to end on the local cluster: a real kubelet runs our images, volumes bind, and the
operator, installed with its chart, runs a pipeline against a real Kafka broker.

Everything talks over 127.0.0.1: pods use the host network, the node's address is 127.0.0.1,
the operator reaches the apiserver through explicit ``KUBERNETES_SERVICE_HOST/PORT``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from demo.run import DRIVER_CPU, SCHEDULING_TIMEOUT, Images, eventually, operator_values
from devenv.cluster import NODE_NAME, REPO
from devenv.cluster_images import oci_archive
from devenv.kafka import KafkaBroker
from tests.e2e.conftest import E2ECluster
from tests.plugins.kafka import TopicFactory

pytestmark = pytest.mark.e2e

CHART = REPO / "charts" / "eop"


# ----------------------------------------------------------------------------- helpers


def _eventually(check: Callable[[], Any], timeout: float, what: Callable[[], str] | str) -> Any:
    """Poll ``check`` every 0.5 s until truthy; fail naming ``what`` after ``timeout``."""
    return eventually(check, timeout, what, interval=0.5)


def _get(e2e: E2ECluster, *args: str) -> dict[str, Any]:
    result = e2e.cluster.kubectl("get", "-o", "json", *args)
    if result.returncode != 0:
        return {}
    obj: dict[str, Any] = json.loads(result.stdout)
    return obj


def _create(e2e: E2ECluster, *objects: dict[str, Any]) -> None:
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    e2e.cluster.kubectl("create", "-f", "-", input=manifest, check=True)


def _pod(name: str, namespace: str, image: str, args: list[str], **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "args": args,
    }
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "hostNetwork": True,
            "restartPolicy": "Never",
            "containers": [container],
            **spec,
        },
    }


def _phase(e2e: E2ECluster, namespace: str, pod: str) -> str:
    return str(_get(e2e, "pod", pod, "-n", namespace).get("status", {}).get("phase", ""))


def _describe(e2e: E2ECluster, namespace: str, *what: str) -> str:
    result = e2e.cluster.kubectl("describe", "-n", namespace, *what)
    return (result.stdout or result.stderr)[-4000:]


# ----------------------------------------------------------------------------- the node


def test_node_is_ready_on_loopback(local_cluster: E2ECluster) -> None:
    node = _get(local_cluster, "node", NODE_NAME)
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True", conditions
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == "127.0.0.1", addresses
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    # The kubelet serves its API on the port it reported, on loopback (the apiserver reaches
    # it there for logs and exec; its node proxy refuses loopback addresses, so probe directly).
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass


def test_up_is_idempotent(local_cluster: E2ECluster) -> None:
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "devenv.cluster", "up", "--no-images"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "EOP_CLUSTER_DIR": str(local_cluster.cluster.dir)},
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "already running" in result.stderr
    assert f"KUBECONFIG={local_cluster.cluster.kubeconfig}" in result.stdout
    assert time.monotonic() - began < 30


def test_loading_the_images_again_removes_an_older_eop_image_whole(
    local_cluster: E2ECluster, tmp_path: Path
) -> None:
    """An image of an older tree goes with the next load: its tag and the CRI's id ref (which
    alone would keep its layers on the node's disk for good)."""
    cluster = local_cluster.cluster
    older = f"localhost/eop-operator:older-{uuid.uuid4().hex[:8]}"
    archive = tmp_path / "older.tar"
    oci_archive(archive, older, {"older": b"#!/bin/sh\n"}, ["/older"])
    snapshotter = str(cluster.state().get("snapshotter", "overlayfs"))
    cluster.ctr("images", "import", f"--snapshotter={snapshotter}", str(archive), check=True)

    def refs() -> dict[str, str]:
        lines = cluster.ctr("images", "ls", check=True).stdout.splitlines()[1:]
        return {f[0]: f[2] for line in lines if len(f := line.split()) > 2}

    digest = refs()[older]
    _eventually(
        lambda: any(r.startswith("sha256:") and d == digest for r, d in refs().items()),
        30,
        "the CRI to name the older image by its id",
    )
    loaded = cluster.load_images()
    left = refs()
    assert [r for r, d in left.items() if d == digest] == []
    assert set(loaded.values()) <= set(left)


# ----------------------------------------------------------------------------- pods


def test_operator_image_runs_to_completion_with_readable_logs(
    local_cluster: E2ECluster, e2e_namespace: str
) -> None:
    began = time.monotonic()
    _create(local_cluster, _pod("crd", e2e_namespace, local_cluster.operator_image, ["crd"]))
    _eventually(
        lambda: _phase(local_cluster, e2e_namespace, "crd") in ("Succeeded", "Failed"),
        120,
        lambda: "pod crd to finish:\n" + _describe(local_cluster, e2e_namespace, "pod", "crd"),
    )
    elapsed = time.monotonic() - began
    assert _phase(local_cluster, e2e_namespace, "crd") == "Succeeded", _describe(
        local_cluster, e2e_namespace, "pod", "crd"
    )
    print(f"pod `eop crd` created -> Succeeded in {elapsed:.1f}s")
    logs = local_cluster.cluster.kubectl("logs", "-n", e2e_namespace, "crd", check=True).stdout
    assert "kind: CustomResourceDefinition" in logs
    assert "exactlyoncepipelines.exactlyonce.io" in logs
    pod = _get(local_cluster, "pod", "crd", "-n", e2e_namespace)
    assert pod["status"]["podIP"] == "127.0.0.1"
    # The image's own user, not root.
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_default_class_claim_binds_and_is_writable_as_uid_1000(
    local_cluster: E2ECluster, e2e_namespace: str
) -> None:
    ns = e2e_namespace
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": ns},
        # No storageClassName: the default class (eop-hostpath) is filled in.
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}},
    }
    write = (
        "import os; open('/data/probe', 'w').write(str(os.getuid())); "
        "print('uid', os.getuid(), sorted(os.listdir('/data')))"
    )
    pod = _pod(
        "writer",
        ns,
        local_cluster.operator_image,
        ["-c", write],
        container={
            "command": ["python3"],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        },
        securityContext={"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True},
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
    )
    _create(local_cluster, claim, pod)
    bound = _eventually(
        lambda: (
            _get(local_cluster, "pvc", "data", "-n", ns).get("status", {}).get("phase") == "Bound"
        ),
        60,
        "the claim to bind",
    )
    assert bound
    pvc = _get(local_cluster, "pvc", "data", "-n", ns)
    assert pvc["spec"]["storageClassName"] == "eop-hostpath"
    pv = _get(local_cluster, "pv", pvc["spec"]["volumeName"])
    host_dir = Path(pv["spec"]["hostPath"]["path"])
    assert local_cluster.cluster.volumes_dir in host_dir.parents
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == [NODE_NAME]
    _eventually(
        lambda: _phase(local_cluster, ns, "writer") in ("Succeeded", "Failed"),
        120,
        lambda: "the writer pod:\n" + _describe(local_cluster, ns, "pod", "writer"),
    )
    logs = local_cluster.cluster.kubectl("logs", "-n", ns, "writer").stdout
    assert _phase(local_cluster, ns, "writer") == "Succeeded", logs
    assert "uid 1000 ['probe']" in logs
    probe = host_dir / "probe"
    assert probe.read_text() == "1000"
    assert probe.stat().st_uid == 1000
    # Reclaim policy Delete: the provisioner removes the volume and its directory.
    local_cluster.cluster.kubectl("delete", "pod", "writer", "-n", ns, "--wait=true", check=True)
    local_cluster.cluster.kubectl("delete", "pvc", "data", "-n", ns, "--wait=true", check=True)
    _eventually(
        lambda: not _get(local_cluster, "pv", pv["metadata"]["name"]) and not host_dir.exists(),
        60,
        "the released volume and its directory to be deleted",
    )


# ----------------------------------------------------------------------------- operator


def _pipeline(name: str, ns: str, servers: str, source: str, sink: str) -> dict[str, Any]:
    return {
        "apiVersion": "exactlyonce.io/v1alpha1",
        "kind": "ExactlyOncePipeline",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            # The image is only in the node's containerd: never pull.
            "imagePullPolicy": "Never",
            "source": {
                "kafka": {
                    "bootstrapServers": servers,
                    "topics": [source],
                    "startingOffsets": "earliest",
                }
            },
            "transform": {"sql": "SELECT key, value FROM source"},
            "sink": {"kafka": {"bootstrapServers": servers, "topic": sink}},
            "trigger": {"processingTime": "2s"},
            "spark": {"master": "local[1]", "driver": {"cores": 1, "memory": "512m"}},
            # No pod network here: the driver reaches the broker on 127.0.0.1. Half a core,
            # so that two drivers and the operator fit on the node's 2 cores.
            "driver": {"hostNetwork": True, "resources": {"requests": {"cpu": DRIVER_CPU}}},
        },
    }


def _produce(broker: KafkaBroker, topic: str, records: list[tuple[str, str]]) -> None:
    from confluent_kafka import Producer

    producer = Producer(broker.client_config({"enable.idempotence": True}))
    for key, value in records:
        producer.produce(topic, key=key.encode(), value=value.encode())
    assert producer.flush(30) == 0


def _read_committed(
    broker: KafkaBroker,
    topic: str,
    expected: int | Callable[[list[tuple[str, str]]], bool],
    timeout: float,
    settle: float,
) -> list[tuple[str, str]]:
    """Read ``topic`` as a read_committed consumer until ``expected`` records arrived (or what
    was read satisfies ``expected``, a predicate), or ``timeout``; then ``settle`` seconds more
    to catch duplicates."""
    enough = expected if callable(expected) else lambda seen: len(seen) >= expected
    from confluent_kafka import Consumer

    consumer = Consumer(
        broker.client_config(
            {
                "group.id": f"e2e-reader-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
    )
    consumer.subscribe([topic])
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout
    settle_until: float | None = None
    try:
        while True:
            now = time.monotonic()
            if settle_until is None and enough(seen):
                settle_until = now + settle
            if (settle_until is not None and now > settle_until) or now > deadline:
                return seen
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            seen.append(((msg.key() or b"").decode(), (msg.value() or b"").decode()))
    finally:
        consumer.close()


def _driver_pod(e2e: E2ECluster, ns: str, pipeline: str) -> dict[str, Any]:
    pods = _get(e2e, "pods", "-n", ns, "-l", f"exactlyonce.io/pipeline={pipeline}")
    items = [p for p in pods.get("items", []) if p["metadata"]["name"].endswith("-driver-0")]
    return items[0] if items else {}


def _container_started(pod: dict[str, Any]) -> bool:
    for status in pod.get("status", {}).get("containerStatuses", []):
        for state in (status.get("state", {}), status.get("lastState", {})):
            if "running" in state or "terminated" in state:
                return True
    return False


def _termination_messages(pod: dict[str, Any]) -> list[str]:
    messages = []
    for status in pod.get("status", {}).get("containerStatuses", []):
        for state in (status.get("state", {}), status.get("lastState", {})):
            term = state.get("terminated")
            if term:
                messages.append(
                    f"exit {term.get('exitCode')} {term.get('reason')}: {term.get('message', '')}"
                )
    return messages


def _release(ns: str) -> str:
    """The name of the chart's release that :func:`_operator` installs for ``ns``."""
    return f"eop-{ns.removeprefix('e2e-')}"


@contextlib.contextmanager
def _operator(
    e2e: E2ECluster, ns: str, tmp_path: Path, extra_values: dict[str, Any] | None = None
) -> Iterator[tuple[str, str]]:
    """The chart installed into ``<ns>-ops`` watching ``ns``; yields (its namespace, its pod).

    ``extra_values``: chart values on top of the cluster's (``demo.run.operator_values``).
    On exit the pipelines of ``ns`` are deleted while the operator still runs (it removes
    their finalizer), then the release.
    """
    cluster = e2e.cluster
    ops_ns = f"{ns}-ops"
    release = _release(ns)
    cluster.kubectl("create", "namespace", ops_ns, check=True)
    images = Images(operator=e2e.operator_image, spark=e2e.spark_image)
    values = operator_values(cluster, images, [ns]) | (extra_values or {})
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps(values))
    try:
        # helm installs crds/ only when the CRD is absent; apply the current one first.
        cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"), check=True
        )
        began = time.monotonic()
        install = cluster.helm(
            "install", release, str(CHART), "-n", ops_ns, "-f", str(values_file), "--wait",
            "--timeout=180s",
        )  # fmt: skip
        assert install.returncode == 0, install.stderr + "\n" + _describe(e2e, ops_ns, "pods")
        print(f"helm install --wait: operator Ready in {time.monotonic() - began:.1f}s")
        operator_pods = _get(e2e, "pods", "-n", ops_ns)["items"]
        assert len(operator_pods) == 1
        ready = {c["type"]: c["status"] for c in operator_pods[0]["status"]["conditions"]}
        assert ready["Ready"] == "True"
        yield ops_ns, operator_pods[0]["metadata"]["name"]
    finally:
        cluster.kubectl(
            "delete", "exactlyoncepipelines", "--all", "-n", ns, "--wait=true", "--timeout=90s"
        )
        cluster.helm("uninstall", release, "-n", ops_ns, "--wait", "--timeout=120s")
        cluster.kubectl("delete", "namespace", ops_ns, "--wait=false")


@pytest.mark.kafka
def test_operator_from_chart_runs_a_pipeline_exactly_once(
    local_cluster: E2ECluster,
    e2e_namespace: str,
    kafka_broker: KafkaBroker,
    kafka_topic_factory: TopicFactory,
    tmp_path: Path,
) -> None:
    e2e, ns = local_cluster, e2e_namespace
    cluster = e2e.cluster
    with _operator(e2e, ns, tmp_path) as (ops_ns, operator_pod):
        source = kafka_topic_factory(2, prefix="e2e-in")
        sink = kafka_topic_factory(2, prefix="e2e-out")
        first = [(f"k{i}", f"v{i}") for i in range(20)]
        second = [(f"k{i}", f"v{i}") for i in range(20, 40)]
        _produce(kafka_broker, source, first)
        pipeline = "e2e"
        _create(e2e, _pipeline(pipeline, ns, kafka_broker.bootstrap_servers, source, sink))
        began = time.monotonic()

        def diagnostics() -> str:
            pod = _driver_pod(e2e, ns, pipeline)
            name = pod.get("metadata", {}).get("name", f"{pipeline}-driver-0")
            logs = cluster.kubectl("logs", "-n", ns, name, "--tail=60").stdout
            previous = cluster.kubectl("logs", "-n", ns, name, "--previous", "--tail=60").stdout
            operator_logs = cluster.kubectl("logs", "-n", ops_ns, operator_pod, "--tail=40")
            status = _get(e2e, "exactlyoncepipeline", pipeline, "-n", ns).get("status")
            return (
                f"\n--- pipeline status: {json.dumps(status)}"
                f"\n--- driver termination: {_termination_messages(pod)}"
                f"\n--- driver logs:\n{logs}\n--- previous driver logs:\n{previous}"
                f"\n--- operator logs:\n{operator_logs.stdout}{operator_logs.stderr}"
                f"\n--- describe:\n{_describe(e2e, ns, 'pods')}"
            )

        # 1. The operator (in-cluster config, via KUBERNETES_SERVICE_HOST/PORT) reconciles the
        # pipeline: it gets a status, its claim binds and its driver pod starts.
        _eventually(
            lambda: _get(e2e, "exactlyoncepipeline", pipeline, "-n", ns).get("status"),
            90,
            lambda: "the operator to reconcile the pipeline (a status)" + diagnostics(),
        )
        pod = _eventually(
            lambda: (p := _driver_pod(e2e, ns, pipeline)) and _container_started(p) and p,
            SCHEDULING_TIMEOUT,
            lambda: "the driver container to start" + diagnostics(),
        )
        print(f"pipeline created -> driver container started in {time.monotonic() - began:.1f}s")
        pvc = _get(e2e, "pvc", f"{pipeline}-checkpoint", "-n", ns)
        assert pvc["status"]["phase"] == "Bound"
        assert pod["status"]["podIP"] == "127.0.0.1"
        # 2. What the driver says is visible: its logs or its termination message.
        name = pod["metadata"]["name"]
        _eventually(
            lambda: (
                cluster.kubectl("logs", "-n", ns, name).stdout.strip()
                or _termination_messages(_driver_pod(e2e, ns, pipeline))
            ),
            120,
            lambda: "driver logs or a termination message" + diagnostics(),
        )
        # 3. The driver keeps running (phase Running, not crash-looping) ...
        _eventually(
            lambda: _driver_pod(e2e, ns, pipeline).get("status", {}).get("phase") == "Running",
            120,
            lambda: "the driver pod to be Running" + diagnostics(),
        )
        # ... and the transform output lands in the sink exactly once, for records produced
        # before and while the pipeline runs.
        _produce(kafka_broker, source, second)
        expected = first + second
        seen = _read_committed(kafka_broker, sink, len(expected), timeout=300, settle=10)
        print(f"pipeline created -> {len(seen)} sink records in {time.monotonic() - began:.1f}s")
        counts = Counter(seen)
        duplicates = {r: n for r, n in counts.items() if n > 1}
        missing = set(expected) - set(counts)
        assert not missing and not duplicates and set(counts) == set(expected), (
            f"sink not exactly-once: {len(missing)} missing, duplicates {duplicates}, "
            f"unexpected {set(counts) - set(expected)}" + diagnostics()
        )


def _pod_scheduled(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's PodScheduled condition ({} before the scheduler has looked at it)."""
    conditions = pod.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "PodScheduled"), {})


def _unscheduled_reason(pod: dict[str, Any]) -> str:
    """Why the scheduler has not placed ``pod``, or ''."""
    if not pod:
        return "(no pod)"
    condition = _pod_scheduled(pod)
    if condition and condition["status"] != "True":
        return f"not scheduled: {condition.get('message', condition.get('reason', ''))}"
    return ""


def _scheduled_at(pod: dict[str, Any]) -> str | None:
    condition = _pod_scheduled(pod)
    return str(condition["lastTransitionTime"]) if condition.get("status") == "True" else None


def _metrics(port: int) -> dict[str, float]:
    """The driver's /metrics on the node (host network): counter name -> value."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    return {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


#: The brief of issue 5: a driver is scheduled within seconds of apply, never parked for
#: minutes while its checkpoint claim binds (the StorageClass waits for the first consumer).
SCHEDULED_WITHIN = 30.0


@pytest.mark.kafka
def test_two_pipelines_run_at_once_on_the_one_node(
    local_cluster: E2ECluster,
    e2e_namespace: str,
    kafka_broker: KafkaBroker,
    kafka_topic_factory: TopicFactory,
    tmp_path: Path,
) -> None:
    e2e, ns = local_cluster, e2e_namespace
    with _operator(e2e, ns, tmp_path) as (ops_ns, operator_pod):
        pipelines: dict[str, tuple[str, list[tuple[str, str]], dict[str, Any]]] = {}
        for name in ("left", "right"):
            source = kafka_topic_factory(2, prefix=f"e2e-{name}-in")
            sink = kafka_topic_factory(2, prefix=f"e2e-{name}-out")
            records = [(f"{name}{i}", f"v{i}") for i in range(30)]
            _produce(kafka_broker, source, records)
            manifest = _pipeline(name, ns, kafka_broker.bootstrap_servers, source, sink)
            pipelines[name] = (sink, records, manifest)
        began = time.monotonic()
        _create(e2e, *(manifest for _, _, manifest in pipelines.values()))

        def diagnostics() -> str:
            text = ""
            for name in pipelines:
                pod = f"{name}-driver-0"
                logs = e2e.cluster.kubectl("logs", "-n", ns, pod, "--tail=40").stdout
                previous = e2e.cluster.kubectl("logs", "-n", ns, pod, "--previous", "--tail=40")
                found = _driver_pod(e2e, ns, name)
                text += (
                    f"\n--- {pod}: {_termination_messages(found)} {_unscheduled_reason(found)}"
                    f"\n{logs}\n--- {pod}, previous container:\n{previous.stdout}"
                )
            operator_logs = e2e.cluster.kubectl("logs", "-n", ops_ns, operator_pod, "--tail=30")
            return text + f"\n--- operator logs:\n{operator_logs.stdout}{operator_logs.stderr}"

        # 1. Both drivers are scheduled within seconds: neither waits for the other's ports or
        # CPU, nor for its checkpoint claim.
        scheduled: dict[str, float] = {}

        def both_scheduled() -> bool:
            for name in pipelines:
                if name not in scheduled and _driver_pod(e2e, ns, name).get("spec", {}).get(
                    "nodeName"
                ):
                    scheduled[name] = time.monotonic() - began
            return len(scheduled) == len(pipelines)

        _eventually(
            both_scheduled, SCHEDULED_WITHIN, lambda: f"both drivers scheduled{diagnostics()}"
        )
        print(f"applied -> driver pods scheduled after {scheduled} s")
        for name in pipelines:
            pod = _driver_pod(e2e, ns, name)
            claim = _get(e2e, "pvc", f"{name}-checkpoint", "-n", ns)
            assert claim["status"]["phase"] == "Bound", claim
            print(f"{name}: pod created {pod['metadata']['creationTimestamp']}, "
                  f"scheduled {_scheduled_at(pod)}")  # fmt: skip

        # 2. Both run at the same time, each with its own metrics host port ...
        def both_running() -> list[dict[str, Any]] | None:
            pods = [_driver_pod(e2e, ns, name) for name in pipelines]
            running = all(p.get("status", {}).get("phase") == "Running" for p in pods)
            return pods if running else None

        pods = _eventually(both_running, SCHEDULING_TIMEOUT, lambda: "both Running" + diagnostics())
        ports = [p["spec"]["containers"][0]["ports"] for p in pods]
        assert all(len(declared) == 1 and declared[0]["name"] == "metrics" for declared in ports)
        metrics_ports = [declared[0]["hostPort"] for declared in ports]
        assert len(set(metrics_ports)) == 2, metrics_ports

        # ... and both commit: exactly-once output in each sink, and each driver's own
        # /metrics (on its host port) counts committed batches.
        for name, (sink, records, _) in pipelines.items():
            seen = _read_committed(kafka_broker, sink, len(records), timeout=240, settle=5)
            counts = Counter(seen)
            assert set(counts) == set(records) and max(counts.values()) == 1, (
                f"{name}: {len(set(records) - set(counts))} missing, "
                f"{sum(n - 1 for n in counts.values())} duplicates" + diagnostics()
            )
        for name, port in zip(pipelines, metrics_ports, strict=True):
            committed = _eventually(
                lambda port=port: _metrics(port).get("eop_batches_committed_total"),
                60,
                f"{name}'s /metrics on 127.0.0.1:{port} to count a committed batch",
            )
            print(f"{name}: /metrics on host port {port}: {committed:.0f} batches committed")
        for name in pipelines:
            assert _driver_pod(e2e, ns, name)["status"]["phase"] == "Running", diagnostics()


def test_what_keeps_a_driver_from_running_is_in_the_reason_column(
    local_cluster: E2ECluster, e2e_namespace: str, tmp_path: Path
) -> None:
    """A real kubelet and scheduler: no pod network, an image that is not there, too much CPU."""
    ns = e2e_namespace
    nowhere = "127.0.0.1:9"  # never reached: none of these drivers starts
    no_network = _pipeline("no-network", ns, nowhere, "in", "out")
    no_network["spec"]["driver"]["hostNetwork"] = False
    no_image = _pipeline("no-image", ns, nowhere, "in", "out")
    no_image["spec"]["image"] = "localhost/eop-not-built:0"
    for small in (no_network, no_image):  # both fit on the node next to the operator
        small["spec"]["driver"]["resources"]["requests"]["cpu"] = "100m"
    too_big = _pipeline("too-big", ns, nowhere, "in", "out")
    too_big["spec"]["driver"]["resources"]["requests"]["cpu"] = "64"
    expected = {
        "no-network": ("SandboxFailed", "Degraded"),
        "no-image": ("ImagePullFailed", "Degraded"),
        "too-big": ("Unschedulable", "Pending"),
    }

    def reasons() -> dict[str, tuple[str, str]]:
        found = {}
        for item in _get(local_cluster, "eop", "-n", ns).get("items", []):
            status = item.get("status", {})
            conditions: list[dict[str, str]] = status.get("conditions", [])
            ready = next((c for c in conditions if c["type"] == "Ready"), {})
            found[item["metadata"]["name"]] = (ready.get("reason", ""), status.get("phase", ""))
        return found

    with _operator(local_cluster, ns, tmp_path):
        local_cluster.cluster.apply(no_network, no_image, too_big)
        _eventually(
            lambda: reasons() == expected,
            120,
            lambda: (
                f"the causes {expected}; seen {reasons()}\n"
                + local_cluster.cluster.kubectl("get", "eop,pods", "-n", ns).stdout
            ),
        )
        table = local_cluster.cluster.kubectl("get", "eop", "-n", ns, check=True).stdout
        print(table)
        for name, (reason, _) in expected.items():
            row = next(line for line in table.splitlines() if line.startswith(name + " "))
            assert reason in row.split(), table
        messages = {
            item["metadata"]["name"]: next(
                c["message"] for c in item["status"]["conditions"] if c["type"] == "Ready"
            )
            for item in _get(local_cluster, "eop", "-n", ns)["items"]
        }
        print(json.dumps(messages, indent=1))
        assert "localhost/eop-not-built:0" in messages["no-image"]
        assert "Insufficient cpu" in messages["too-big"]
