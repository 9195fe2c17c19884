"""Executors as pods: the template Spark builds them from, and the RPC they talk over.

With ``spec.spark.master: k8s://...`` the driver runs Spark's Kubernetes scheduler backend
(client mode): it creates the executor pods itself, with the RBAC of :mod:`render.rbac`, from a
pod template the operator renders here into the pipeline's ConfigMap
(``spark.kubernetes.executor.podTemplateFile``). Spark adds what is its own: the pod's name,
labels and owner (the driver pod, so executors go with it), image, arguments (``executor``,
which the image's ``eop`` entry point runs), its environment, the container's memory and CPU
(the figures rendered here too, so both agree) and an emptyDir for its local directories.

The template hardens executors as the driver: uid 1000, read-only root filesystem with an
emptyDir ``/tmp``, every capability dropped, no privilege escalation, the RuntimeDefault seccomp
profile, and no service-account token (executors never call the API server). It mounts the
Kafka Secrets the pipeline names at the driver's paths (Spark's Kafka source and the sink's
tasks run here, and a trust store named by path must exist here too), and the RPC key.

Spark RPC between driver and executors carries the sink's and source's credentials in task
closures, so it is authenticated (``spark.authenticate``) and encrypted (AES, Spark's version-2
auth engine, no fallback to SASL; shuffle and spill files too) with a key of the pipeline's
own: a random key in a Secret the operator creates once (:func:`render_rpc_secret`), mounted
read-only in the driver and in every executor at the same path
(``spark.authenticate.secret.file``). With the key in a file Spark puts no secret in the
executor pods' environment, where whoever may read pods would find it.
"""

from __future__ import annotations

import base64
from typing import Any

import yaml

from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.render.naming import (
    child_metadata,
    executor_labels,
    rpc_secret_name,
    selector_labels,
)
from eop_operator.render.pods import (
    checkpoint_credentials_env,
    container_resources,
    container_security_context,
    kafka_secret_volumes,
    memory_overhead_mib,
    pod_security_context,
    secret_dir,
    spark_memory_mib,
)
from eop_spark.contract.owned_settings import RPC_SECURITY_CONF

#: The executor pod template's key in the pipeline's ConfigMap (mounted at ``CONFIG_DIR``).
EXECUTOR_TEMPLATE_KEY = "executor-pod.yaml"
#: The executor container's name in the template (``podTemplateContainerName``).
EXECUTOR_CONTAINER = "executor"
#: Where driver and executors mount the RPC key, beside the Kafka Secrets.
RPC_SECRET_DIR = secret_dir("spark-rpc")
#: The key's file in the Secret.
RPC_SECRET_KEY = "key"
#: Bytes of a new RPC key (Spark's own generated keys are 256 bits too).
RPC_KEY_BYTES = 32
#: The executor's launcher reads the master from here (see eop_spark.runtime.executor).
MASTER_ENV = "EOP_SPARK_MASTER"


def executor_memory_mib(pipeline: ExactlyOncePipeline) -> tuple[int, int]:
    """The executor's heap and its memory overhead, in MiB.

    The overhead is ``spark.executor.memoryOverhead`` from ``spec.spark.conf`` when given,
    else Spark's default; the operator hands Spark the same figure, so the pod Spark makes
    has the memory the template shows. Python workers live in the overhead.
    """
    heap = spark_memory_mib(pipeline.spec.spark.executor.memory)
    given = pipeline.spec.spark.conf.get("spark.executor.memoryOverhead")
    return heap, spark_memory_mib(given) if given else memory_overhead_mib(heap)


def executor_resources(pipeline: ExactlyOncePipeline) -> dict[str, dict[str, str]]:
    """Requests and limits of each executor container (Spark sets the same)."""
    heap, overhead = executor_memory_mib(pipeline)
    cpu = pipeline.spec.executor.resources
    return container_resources(
        cpu_request=cpu.requests.cpu,
        cpu_limit=cpu.limits.cpu,
        cores=pipeline.spec.spark.executor.cores,
        memory_mib=heap + overhead,
    )


def executor_spark_conf(pipeline: ExactlyOncePipeline, template_path: str) -> dict[str, str]:
    """What the driver needs to make hardened executors and talk to them securely.

    ``template_path``: where the driver finds the executor pod template.
    """
    _, overhead = executor_memory_mib(pipeline)
    cpu = pipeline.spec.executor.resources
    conf = {
        "spark.kubernetes.executor.podTemplateFile": template_path,
        "spark.kubernetes.executor.podTemplateContainerName": EXECUTOR_CONTAINER,
        "spark.kubernetes.container.image.pullPolicy": pipeline.spec.image_pull_policy.value,
        "spark.executor.memoryOverhead": f"{overhead}m",
        **RPC_SECURITY_CONF,
        # One file for both sides (driver and executors mount it at one path): an executor
        # reads it before it has the driver's settings.
        "spark.authenticate.secret.file": f"{RPC_SECRET_DIR}/{RPC_SECRET_KEY}",
    }
    if cpu.requests.cpu:
        conf["spark.kubernetes.executor.request.cores"] = cpu.requests.cpu
    if cpu.limits.cpu:
        conf["spark.kubernetes.executor.limit.cores"] = cpu.limits.cpu
    return conf


def rpc_secret_volume(pipeline: ExactlyOncePipeline) -> tuple[dict[str, Any], dict[str, Any]]:
    """The RPC key's volume and its read-only mount (driver and executors alike)."""
    volume = {
        "name": "spark-rpc",
        "secret": {"secretName": rpc_secret_name(pipeline), "defaultMode": 0o400},
    }
    return volume, {"name": "spark-rpc", "mountPath": RPC_SECRET_DIR, "readOnly": True}


def render_rpc_secret(pipeline: ExactlyOncePipeline, key: bytes) -> dict[str, Any]:
    """The pipeline's RPC key Secret, owned by the pipeline (it goes with it).

    The operator creates it once, with ``key`` random, and never reads or rewrites it: a
    running driver holds the key it started with, and every executor it starts later reads
    the same file (see docs/security.md for rotation).
    """
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": child_metadata(pipeline, rpc_secret_name(pipeline), "spark-rpc"),
        "type": "Opaque",
        "immutable": True,
        "data": {RPC_SECRET_KEY: base64.b64encode(key).decode()},
    }


def pod_ip_env() -> list[dict[str, Any]]:
    """Spark's address is the pod's IP: it binds there (``SPARK_LOCAL_IP``) and gives it to
    its peers (``SPARK_LOCAL_HOSTNAME``; otherwise the reverse lookup of that IP, a name only
    cluster DNS resolves, or ``localhost`` on the node's network)."""
    pod_ip = {"valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    return [{"name": name, **pod_ip} for name in ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME")]


def _anti_affinity(pipeline: ExactlyOncePipeline) -> dict[str, Any]:
    """Preferably one executor per node, and not on the driver's node."""

    def away_from(labels: dict[str, str], weight: int) -> dict[str, Any]:
        return {
            "weight": weight,
            "podAffinityTerm": {
                "labelSelector": {"matchLabels": labels},
                "topologyKey": "kubernetes.io/hostname",
            },
        }

    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                away_from(executor_labels(pipeline), 100),
                away_from(selector_labels(pipeline), 50),
            ]
        }
    }


def render_executor_template(pipeline: ExactlyOncePipeline, image: str) -> dict[str, Any]:
    """The executor pod template (a Pod manifest Spark builds each executor from)."""
    rpc_volume, rpc_mount = rpc_secret_volume(pipeline)
    kafka_volumes, kafka_mounts = kafka_secret_volumes(pipeline)
    volumes = [{"name": "tmp", "emptyDir": {}}, rpc_volume, *kafka_volumes]
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, rpc_mount, *kafka_mounts]

    container = {
        "name": EXECUTOR_CONTAINER,
        "image": image,
        "imagePullPolicy": pipeline.spec.image_pull_policy.value,
        # Spark fetches the application's jars into the working directory; the root
        # filesystem is read-only, /tmp is an emptyDir.
        "workingDir": "/tmp",
        "env": [
            {"name": "HOME", "value": "/tmp"},
            {"name": MASTER_ENV, "value": pipeline.spec.spark.master},
            *pod_ip_env(),
            *checkpoint_credentials_env(pipeline),
        ],
        "resources": executor_resources(pipeline),
        "volumeMounts": mounts,
        "securityContext": container_security_context(),
    }
    spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "securityContext": pod_security_context(),
        # Executors never call the API server.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "affinity": _anti_affinity(pipeline),
    }
    if pipeline.spec.driver.host_network:
        # Only where the operator lets the driver on the node's network (a cluster without a
        # pod network): the executors must reach it, and it them, the same way.
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"labels": executor_labels(pipeline)},
        "spec": spec,
    }


def executor_template_yaml(template: dict[str, Any]) -> str:
    """The template as the ConfigMap holds it."""
    return yaml.safe_dump(template, sort_keys=False, width=100)
