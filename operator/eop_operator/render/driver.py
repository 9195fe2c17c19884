"""The driver: a one-replica StatefulSet running ``eop run``, and its headless Service.

A StatefulSet, not a Deployment, because it never runs two pods of one
identity: on an update it deletes the old pod before creating the new one,
and it keeps the driver up while the operator itself is down.
"""

from __future__ import annotations

import re
from typing import Any

from eop_operator.api.models import ExactlyOncePipeline
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
from eop_operator.render.rbac import driver_service_account_name
from eop_spark.config import CONFIG_FILE_NAME
from eop_spark.spec import duration_ms

CONFIG_DIR = "/etc/eop"
CHECKPOINT_MOUNT = "/var/lib/eop/checkpoint"
SECRETS_DIR = "/etc/eop/secrets"
UI_PORT = 4040
METRICS_PORT = 9090
DRIVER_RPC_PORT = 7078
BLOCK_MANAGER_PORT = 7079
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


def kubernetes_spark_conf(pipeline: ExactlyOncePipeline, image: str) -> dict[str, str]:
    """Spark settings a driver needs to run executors as pods next to it."""
    if not pipeline.spec.spark.on_kubernetes:
        return {}
    namespace = pipeline.metadata.namespace
    name = driver_name(pipeline)
    executor = pipeline.spec.spark.executor
    return {
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.container.image": image,
        "spark.kubernetes.driver.pod.name": f"{name}-0",
        "spark.kubernetes.executor.podNamePrefix": name,
        "spark.driver.host": f"{name}-0.{name}.{namespace}.svc",
        "spark.driver.port": str(DRIVER_RPC_PORT),
        "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
        "spark.executor.instances": str(executor.instances),
        "spark.executor.cores": str(executor.cores),
        "spark.executor.memory": executor.memory,
    }


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


def _container(pipeline: ExactlyOncePipeline, image: str) -> dict[str, Any]:
    _, mounts = _volumes(pipeline)
    spark = pipeline.spec.spark
    memory = f"{driver_container_memory_mib(pipeline)}Mi"
    ports = [
        {"name": "spark-ui", "containerPort": UI_PORT},
        {"name": "metrics", "containerPort": METRICS_PORT},
    ]
    if spark.on_kubernetes:
        ports += [
            {"name": "driver-rpc", "containerPort": DRIVER_RPC_PORT},
            {"name": "blockmanager", "containerPort": BLOCK_MANAGER_PORT},
        ]
    return {
        "name": "driver",
        "image": image,
        "imagePullPolicy": pipeline.spec.image_pull_policy.value,
        "args": ["run", "--config", f"{CONFIG_DIR}/{CONFIG_FILE_NAME}", "--log-format", "json"],
        "env": [
            {"name": "EOP_TERMINATION_LOG", "value": "/dev/termination-log"},
            {"name": "SPARK_LOCAL_DIRS", "value": "/tmp/spark"},
            {"name": "HOME", "value": "/tmp"},
            *pipeline.spec.driver.env,
        ],
        "ports": ports,
        "resources": {
            "requests": {"cpu": str(spark.driver.cores), "memory": memory},
            "limits": {"memory": memory},
        },
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def render_pod_template(
    pipeline: ExactlyOncePipeline, image: str, generation: int
) -> dict[str, Any]:
    """The driver pod template (without the spec-hash annotation, added by the caller)."""
    volumes, _ = _volumes(pipeline)
    driver = pipeline.spec.driver
    annotations = {**driver.annotations, GENERATION_ANNOTATION: str(generation)}
    if pipeline.spec.restart_nonce:
        annotations[RESTART_NONCE_ANNOTATION] = pipeline.spec.restart_nonce
    pod_spec: dict[str, Any] = {
        "containers": [_container(pipeline, image)],
        "volumes": volumes,
        "terminationGracePeriodSeconds": termination_grace_seconds(pipeline),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": APP_UID,
            "runAsGroup": APP_UID,
            "fsGroup": APP_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "enableServiceLinks": False,
    }
    service_account = driver_service_account_name(pipeline)
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    # Only drivers that talk to the API server (executors on Kubernetes) get a token.
    pod_spec["automountServiceAccountToken"] = pipeline.spec.spark.on_kubernetes
    if driver.host_network:
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if driver.node_selector:
        pod_spec["nodeSelector"] = dict(driver.node_selector)
    if driver.tolerations:
        pod_spec["tolerations"] = list(driver.tolerations)
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
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": selector_labels(pipeline)},
            "template": pod_template,
        },
    }


def render_driver_service(pipeline: ExactlyOncePipeline) -> dict[str, Any]:
    """Headless Service: stable DNS for the driver, the Spark UI and metrics."""
    ports = [
        {"name": "spark-ui", "port": UI_PORT, "targetPort": "spark-ui"},
        {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"},
    ]
    if pipeline.spec.spark.on_kubernetes:
        ports += [
            {"name": "driver-rpc", "port": DRIVER_RPC_PORT, "targetPort": "driver-rpc"},
            {"name": "blockmanager", "port": BLOCK_MANAGER_PORT, "targetPort": "blockmanager"},
        ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(pipeline, driver_name(pipeline), "driver"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(pipeline),
            "ports": ports,
        },
    }
