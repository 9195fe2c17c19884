"""The driver: a one-replica StatefulSet running ``eop run``, and its headless Service.

A StatefulSet, not a Deployment, because it never runs two pods of one
identity: on an update it deletes the old pod before creating the new one,
and it keeps the driver up while the operator itself is down.
"""

from __future__ import annotations

import re
from typing import Any

from eop_operator.api.models import (
    CHECKPOINT_SECRET_KEYS,
    CHECKPOINT_SECRET_OPTIONAL_KEYS,
    ExactlyOncePipeline,
)
from eop_operator.render.naming import (
    GENERATION_ANNOTATION,
    RESTART_NONCE_ANNOTATION,
    checkpoint_claim_name,
    child_metadata,
    common_labels,
    config_map_name,
    driver_name,
    selector_labels,
)
from eop_operator.render.ports import (
    DriverPorts,
    HostPortRange,
    driver_ports,
    preferred_host_port,
)
from eop_operator.render.rbac import driver_service_account_name
from eop_spark.config import CONFIG_FILE_NAME
from eop_spark.session import SCRATCH_ENV
from eop_spark.spec import duration_ms

CONFIG_DIR = "/etc/eop"
CHECKPOINT_MOUNT = "/var/lib/eop/checkpoint"
SECRETS_DIR = "/etc/eop/secrets"
#: Non-root user of the application image (see Dockerfile).
APP_UID = 1000
#: Slack on top of one trigger interval plus the transaction timeout.
GRACE_SLACK_SECONDS = 30

_SPARK_MEMORY_MIB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def _memory_mib(spark_memory: str) -> int:
    match = re.fullmatch(r"([0-9]+)([kmgt])", spark_memory)
    if match is None:
        raise ValueError(f"invalid Spark memory {spark_memory!r}")
    return max(1, int(int(match.group(1)) * _SPARK_MEMORY_MIB[match.group(2)]))


def driver_container_memory_mib(pipeline: ExactlyOncePipeline) -> int:
    """Heap plus Spark's default overhead (10 %, at least 384 MiB)."""
    heap = _memory_mib(pipeline.spec.spark.driver.memory)
    return heap + max(384, heap // 10)


def termination_grace_seconds(pipeline: ExactlyOncePipeline) -> int:
    """Long enough for the batch in flight to commit: one interval plus the txn timeout."""
    interval_ms = pipeline.spec.trigger.interval_ms()
    timeout_ms = duration_ms(pipeline.spec.sink.kafka.transaction_timeout)
    return (interval_ms + timeout_ms) // 1000 + GRACE_SLACK_SECONDS


def secret_dir(side: str) -> str:
    """Where the Secret of the source or sink is mounted in the driver."""
    return f"{SECRETS_DIR}/{side}"


def default_driver_ports(pipeline: ExactlyOncePipeline) -> DriverPorts:
    """The driver's ports when the operator assigned none: on the host network, the metrics
    port derived from the pipeline's identity in the default range (what ``eop render`` shows).
    """
    metrics = preferred_host_port(pipeline.pipeline_id, HostPortRange())
    return driver_ports(host_network=pipeline.spec.driver.host_network, metrics_host_port=metrics)


def driver_spark_conf(
    pipeline: ExactlyOncePipeline, image: str, ports: DriverPorts | None = None
) -> dict[str, str]:
    """Spark settings of the driver's ports, and what it needs to run executors as pods."""
    ports = ports or default_driver_ports(pipeline)
    conf: dict[str, str] = {}
    if ports.host_network:
        # Port 0: Spark binds a free port (see render.ports); executors learn the actual ones.
        conf["spark.ui.port"] = str(ports.ui)
    if not pipeline.spec.spark.on_kubernetes:
        return conf
    namespace = pipeline.metadata.namespace
    name = driver_name(pipeline)
    executor = pipeline.spec.spark.executor
    return (
        conf
        | executor_credentials_conf(pipeline)
        | {
            "spark.kubernetes.namespace": namespace,
            "spark.kubernetes.container.image": image,
            "spark.kubernetes.driver.pod.name": f"{name}-0",
            "spark.kubernetes.executor.podNamePrefix": name,
            "spark.driver.host": f"{name}-0.{name}.{namespace}.svc",
            "spark.driver.port": str(ports.driver_rpc),
            "spark.driver.blockManager.port": str(ports.block_manager),
            "spark.executor.instances": str(executor.instances),
            "spark.executor.cores": str(executor.cores),
            "spark.executor.memory": executor.memory,
        }
    )


def checkpoint_credentials_env(pipeline: ExactlyOncePipeline) -> list[dict[str, Any]]:
    """The object store's credentials as environment variables from ``checkpoint.secretRef``.

    References only: the kubelet reads the Secret; its values never pass through the
    operator, the ConfigMap or Spark's configuration. S3A's default credential chain reads
    these variables.
    """
    ref = pipeline.spec.checkpoint.secret_ref
    if ref is None:
        return []
    keys = [(k, False) for k in CHECKPOINT_SECRET_KEYS]
    keys += [(k, True) for k in CHECKPOINT_SECRET_OPTIONAL_KEYS]
    env = []
    for key, optional in keys:
        selector: dict[str, Any] = {"name": ref.name, "key": key}
        if optional:
            selector["optional"] = True
        env.append({"name": key, "valueFrom": {"secretKeyRef": selector}})
    return env


def executor_credentials_conf(pipeline: ExactlyOncePipeline) -> dict[str, str]:
    """Spark settings that give executor pods the same variables (Secret references)."""
    ref = pipeline.spec.checkpoint.secret_ref
    if ref is None:
        return {}
    # Spark's secretKeyRef has no optional form: the required keys only.
    return {
        f"spark.kubernetes.executor.secretKeyRef.{key}": f"{ref.name}:{key}"
        for key in CHECKPOINT_SECRET_KEYS
    }


#: The container security context of every pod the operator renders.
CONTAINER_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
#: The pod security context of every pod the operator renders.
POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": APP_UID,
    "runAsGroup": APP_UID,
    "fsGroup": APP_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def node_placement(pipeline: ExactlyOncePipeline) -> dict[str, Any]:
    """Pod spec fields that place a pipeline's pods: host network, node selector, tolerations,
    and the ServiceAccount (the driver's, or the pipeline's own)."""
    driver = pipeline.spec.driver
    spec: dict[str, Any] = {}
    service_account = driver_service_account_name(pipeline)
    if service_account:
        spec["serviceAccountName"] = service_account
    if driver.host_network:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if driver.node_selector:
        spec["nodeSelector"] = dict(driver.node_selector)
    if driver.tolerations:
        spec["tolerations"] = list(driver.tolerations)
    return spec


def _volumes(pipeline: ExactlyOncePipeline) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_map_name(pipeline)}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if pipeline.spec.checkpoint.claim is not None:
        volumes.append(
            {
                "name": "checkpoint",
                "persistentVolumeClaim": {"claimName": checkpoint_claim_name(pipeline)},
            }
        )
        mounts.append({"name": "checkpoint", "mountPath": CHECKPOINT_MOUNT})
    for side, ref in (
        ("source", pipeline.spec.source.kafka.secret_ref),
        ("sink", pipeline.spec.sink.kafka.secret_ref),
    ):
        if ref is not None:
            # Only the referenced Secret, read-only, readable by the app user alone.
            volumes.append(
                {"name": f"{side}-secret", "secret": {"secretName": ref.name, "defaultMode": 0o400}}
            )
            mounts.append(
                {"name": f"{side}-secret", "mountPath": secret_dir(side), "readOnly": True}
            )
    volumes.extend(pipeline.spec.driver.volumes)
    mounts.extend(pipeline.spec.driver.volume_mounts)
    return volumes, mounts


def driver_resources(pipeline: ExactlyOncePipeline) -> dict[str, dict[str, str]]:
    """Requests and limits of the driver container.

    CPU: ``spec.driver.resources`` when set, else ``spark.driver.cores`` (an integer for
    Spark; the pod may ask for less, e.g. ``500m`` for a light query on a small node).
    Memory: the heap plus Spark's overhead, as request and limit.
    """
    memory = f"{driver_container_memory_mib(pipeline)}Mi"
    cpu = pipeline.spec.driver.resources
    requests = {"cpu": cpu.requests.cpu or str(pipeline.spec.spark.driver.cores), "memory": memory}
    limits = {"memory": memory}
    if cpu.limits.cpu:
        limits["cpu"] = cpu.limits.cpu
    return {"requests": requests, "limits": limits}


def _metrics_host_env(ports: DriverPorts) -> dict[str, Any]:
    # Pod network: any address of the pod. Host network: the node's own address (the pod
    # IP), not every interface of the node.
    if ports.host_network:
        return {
            "name": "EOP_METRICS_HOST",
            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
        }
    return {"name": "EOP_METRICS_HOST", "value": "0.0.0.0"}


def _container(pipeline: ExactlyOncePipeline, image: str, ports: DriverPorts) -> dict[str, Any]:
    _, mounts = _volumes(pipeline)
    container_ports: list[dict[str, Any]] = []
    for name, port in ports.declared(pipeline.spec.spark.on_kubernetes):
        entry: dict[str, Any] = {"name": name, "containerPort": port}
        if ports.host_network:
            entry["hostPort"] = port  # what the API server would default; explicit for review
        container_ports.append(entry)
    return {
        "name": "driver",
        "image": image,
        "imagePullPolicy": pipeline.spec.image_pull_policy.value,
        "args": ["run", "--config", f"{CONFIG_DIR}/{CONFIG_FILE_NAME}", "--log-format", "json"],
        # Spark creates scratch directories relative to the working directory (4.0:
        # artifacts/spark-<uuid>); the root filesystem is read-only, /tmp is an emptyDir.
        "workingDir": "/tmp",
        "env": [
            {"name": "EOP_TERMINATION_LOG", "value": "/dev/termination-log"},
            {"name": SCRATCH_ENV, "value": "/tmp/spark"},
            {"name": "HOME", "value": "/tmp"},
            _metrics_host_env(ports),
            *checkpoint_credentials_env(pipeline),
            *pipeline.spec.driver.env,
        ],
        "ports": container_ports,
        "resources": driver_resources(pipeline),
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": dict(CONTAINER_SECURITY),
    }


def render_pod_template(
    pipeline: ExactlyOncePipeline, image: str, generation: int, ports: DriverPorts | None = None
) -> dict[str, Any]:
    """The driver pod template (without the spec-hash annotation, added by the caller)."""
    ports = ports or default_driver_ports(pipeline)
    volumes, _ = _volumes(pipeline)
    driver = pipeline.spec.driver
    annotations = {**driver.annotations, GENERATION_ANNOTATION: str(generation)}
    if pipeline.spec.restart_nonce:
        annotations[RESTART_NONCE_ANNOTATION] = pipeline.spec.restart_nonce
    pod_spec: dict[str, Any] = {
        "containers": [_container(pipeline, image, ports)],
        "volumes": volumes,
        "terminationGracePeriodSeconds": termination_grace_seconds(pipeline),
        "securityContext": dict(POD_SECURITY),
        "enableServiceLinks": False,
    }
    placement = node_placement(pipeline)
    if "serviceAccountName" in placement:
        pod_spec["serviceAccountName"] = placement.pop("serviceAccountName")
    # Only drivers that talk to the API server (executors on Kubernetes) get a token.
    pod_spec["automountServiceAccountToken"] = pipeline.spec.spark.on_kubernetes
    pod_spec.update(placement)
    return {
        "metadata": {
            "labels": {**driver.labels, **common_labels(pipeline, "driver")},
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


def render_driver_statefulset(
    pipeline: ExactlyOncePipeline, pod_template: dict[str, Any]
) -> dict[str, Any]:
    """The one-replica StatefulSet (zero replicas while suspended)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": child_metadata(pipeline, driver_name(pipeline), "driver"),
        "spec": {
            "replicas": 0 if pipeline.spec.suspend else 1,
            "serviceName": driver_name(pipeline),
            "podManagementPolicy": "OrderedReady",
            # partition 0 spelled out: with a bare RollingUpdate the controller makes a
            # missing pod from the *old* revision while its status still counts the old
            # pod (status.currentReplicas lags a scale-to-zero), and that Pending pod of
            # the old spec then blocks the rollout.  With a partition, always the newest.
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "selector": {"matchLabels": selector_labels(pipeline)},
            "template": pod_template,
        },
    }


def render_driver_service(
    pipeline: ExactlyOncePipeline, ports: DriverPorts | None = None
) -> dict[str, Any]:
    """Headless Service: stable DNS for the driver, and its declared ports (UI, metrics)."""
    declared = (ports or default_driver_ports(pipeline)).declared(pipeline.spec.spark.on_kubernetes)
    service_ports = [{"name": n, "port": p, "targetPort": n} for n, p in declared]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(pipeline, driver_name(pipeline), "driver"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(pipeline),
            "ports": service_ports,
        },
    }
