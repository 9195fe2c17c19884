"""Pipelines on the multi-node local cluster: the operator from the chart on the pod network,
the session's Kafka broker and S3 server reached through the cluster's gateway, pipelines on
executors with their checkpoint in a bucket; and how their progress is watched.

Used by ``test_scale_out.py`` and ``bench/scale_out.py``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demo.run import end_offsets, progress_offsets
from devenv.cluster import LocalCluster
from devenv.kafka import KafkaBroker
from devenv.s3 import S3Server
from tests.e2e.conftest import E2ECluster
from tests.e2e.executor_pods import pipeline_diagnostics
from tests.e2e.test_cluster import _eventually, _get, _operator, _pipeline
from tests.integration.test_pod_security import RESTRICTED as POD_SECURITY_RESTRICTED

EXECUTORS = 2
#: What each driver and executor asks of the nodes' (shared) 2 cores.
POD_CPU = "250m"
#: Heap of driver and executors, and the container memory it makes (Spark's 384 MiB overhead).
HEAP, CONTAINER_MEMORY = "512m", f"{512 + 384}Mi"
#: The in-cluster API server, as the driver reaches it: kube-proxy and CoreDNS.
MASTER = "k8s://https://kubernetes.default.svc"


@dataclass
class ScaleOut:
    """The module's cluster, namespace, operator and the stores pods reach."""

    e2e: E2ECluster
    ns: str
    operator: tuple[str, str]
    broker: KafkaBroker
    s3: S3Server
    bucket: str
    #: ``checkpoint`` of every pipeline here (the Secret holds the keys).
    checkpoint: dict[str, Any]

    @property
    def cluster(self) -> LocalCluster:
        """The multi-node cluster."""
        return self.e2e.cluster

    def pipeline(self, name: str, source: str, sink: str) -> dict[str, Any]:
        """A pipeline on executors of the pod network, its checkpoint in the bucket."""
        servers = self.broker.cluster_bootstrap_servers
        manifest = _pipeline(name, self.ns, servers, source, sink)
        spec = manifest["spec"]
        spec["driver"] = {"resources": {"requests": {"cpu": POD_CPU}}}
        spec["executor"] = {"resources": {"requests": {"cpu": POD_CPU}}}
        spec["spark"] = {
            "master": MASTER,
            "driver": {"cores": 1, "memory": HEAP},
            "executor": {"instances": EXECUTORS, "cores": 1, "memory": HEAP},
        }
        spec["checkpoint"] = self.checkpoint
        return manifest

    def status(self, name: str) -> dict[str, Any]:
        """The pipeline's status."""
        status: dict[str, Any] = _get(self.e2e, "eop", name, "-n", self.ns).get("status", {})
        return status

    def events(self, name: str) -> list[tuple[str, str]]:
        """(reason, message) of the pipeline's events, oldest first."""
        found = _get(
            self.e2e,
            "events",
            "-n",
            self.ns,
            "--field-selector",
            f"involvedObject.kind=ExactlyOncePipeline,involvedObject.name={name}",
        )
        items = sorted(found.get("items", []), key=lambda e: e["metadata"]["creationTimestamp"])
        return [(e["reason"], e["message"]) for e in items]

    def diagnostics(self, name: str) -> Callable[[], str]:
        """What a failure message shows about pipeline ``name``."""
        return lambda: pipeline_diagnostics(self.e2e, self.ns, name, self.operator)


def _operator_off_the_drivers_nodes(ns: str) -> dict[str, Any]:
    """Chart values: the operator never shares a node with a driver of ``ns``."""
    term = {
        "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "driver"}},
        "namespaces": [ns],
        "topologyKey": "kubernetes.io/hostname",
    }
    return {
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    }


@contextlib.contextmanager
def scale_out_environment(
    nodes_e2e: E2ECluster, kafka_broker: KafkaBroker, s3_server: S3Server, work_dir: Path
) -> Iterator[ScaleOut]:
    """The operator (from the chart, on the pod network) serving a fresh namespace whose pods
    reach the broker and the S3 server; a bucket and the Secret with its keys there. All of
    it goes at the end (lost nodes are restored)."""
    cluster = nodes_e2e.cluster
    ns = f"e2e-so-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns, check=True)
    # Every pod of the namespace (drivers, the executors Spark creates, the checkpoint
    # deletion Job's) must pass Pod Security's restricted profile to be created at all.
    cluster.kubectl("label", "namespace", ns, POD_SECURITY_RESTRICTED, check=True)
    s3_port = int(s3_server.endpoint.rsplit(":", 1)[1])
    cluster.expose_host_port(kafka_broker.cluster_port)
    s3_address = cluster.expose_host_port(s3_port)
    bucket = f"eop-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "checkpoints-s3", "namespace": ns},
        "stringData": s3_server.credentials_env(),
    }
    cluster.apply(secret)
    checkpoint = {
        "uri": f"s3a://{bucket}/pipelines",
        "secretRef": {"name": "checkpoints-s3"},
        "options": s3_server.hadoop_options() | {"fs.s3a.endpoint": f"http://{s3_address}"},
    }
    try:
        with _operator(nodes_e2e, ns, work_dir, _operator_off_the_drivers_nodes(ns)) as operator:
            yield ScaleOut(nodes_e2e, ns, operator, kafka_broker, s3_server, bucket, checkpoint)
    finally:
        restore_lost_nodes(cluster)
        cluster.kubectl("delete", "namespace", ns, "--wait=false")
        cluster.unexpose_host_port(kafka_broker.cluster_port)
        cluster.unexpose_host_port(s3_port)
        s3_server.delete_bucket(bucket)


def restore_lost_nodes(cluster: LocalCluster) -> None:
    """Boot again every node a test lost."""
    for name, state in cluster.node_states().items():
        if state == "lost":
            cluster.restore_node(name)


def node_of(pod: dict[str, Any]) -> str:
    """The node a pod is bound to ("" before it is scheduled)."""
    return str(pod.get("spec", {}).get("nodeName") or "")


def committed_records(broker: KafkaBroker, pipeline: str, ns: str, topic: str) -> int:
    """How many source records the pipeline's progress group has passed, summed."""
    return sum(progress_offsets(broker, f"eop.{ns}.{pipeline}", topic).values())


def batch_committed_since(
    broker: KafkaBroker, group: str, topic: str, before: dict[int, int]
) -> Callable[[], bool]:
    """Whether a batch has committed since the progress group held ``before``: every
    partition is past it, or at the end of what was written."""

    def committed() -> bool:
        done, end = progress_offsets(broker, group, topic), end_offsets(broker, topic)
        return all(done.get(p, 0) > before.get(p, 0) or done.get(p, 0) >= e for p, e in end.items())

    return committed


#: A condition polled until it holds.
Check = Callable[[], bool]


def then(first: Check, make_next: Callable[[], Check]) -> Check:
    """A check that holds once ``first`` has held and then the check ``make_next`` makes at
    that moment (e.g. a batch committed since then) holds."""
    state: dict[str, Check] = {}

    def check() -> bool:
        if "next" not in state:
            if not first():
                return False
            state["next"] = make_next()
        return state["next"]()

    return check


def first_held(
    checks: dict[str, Check], timeout: float, what: Callable[[], str], since: float | None = None
) -> dict[str, float]:
    """Poll every check until each has held once; the seconds until each first held, counted
    from ``since`` (a ``time.monotonic()``; default: now)."""
    began, times = time.monotonic() if since is None else since, {}
    while len(times) < len(checks):
        for name, check in checks.items():
            if name not in times and check():
                times[name] = time.monotonic() - began
        if time.monotonic() - began > timeout:
            missing = sorted(set(checks) - set(times))
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {missing}: {what()}")
        time.sleep(0.5)
    return times


def wait_caught_up(so: ScaleOut, pipeline: str, topic: str, timeout: float) -> float:
    """Wait until the progress group holds the source's end offsets; the seconds it took."""
    began = time.monotonic()
    state: dict[str, Any] = {}

    def caught_up() -> bool:
        state["end"] = end_offsets(so.broker, topic)
        state["done"] = progress_offsets(so.broker, f"eop.{so.ns}.{pipeline}", topic)
        return all(state["done"].get(p, 0) >= e for p, e in state["end"].items())

    _eventually(
        caught_up,
        timeout,
        lambda: (
            f"{pipeline} caught up: end {state.get('end')}, committed {state.get('done')}"
            + so.diagnostics(pipeline)()
        ),
    )
    return time.monotonic() - began
