"""What the driver pod and the executor pods share: the user, the hardening, memory, Secrets.

One place, so an executor is never hardened less than its driver.
"""

from __future__ import annotations

from typing import Any

from eop_operator.api.models import (
    CHECKPOINT_SECRET_KEYS,
    CHECKPOINT_SECRET_OPTIONAL_KEYS,
    ExactlyOncePipeline,
)
from eop_operator.render.rbac import driver_service_account_name

#: Non-root user of the application image (see Dockerfile).
APP_UID = 1000
#: Where the Kafka Secrets a pipeline names are mounted.
SECRETS_DIR = "/etc/eop/secrets"
#: Spark's least memory overhead per JVM container, and its share of the heap otherwise.
MIN_MEMORY_OVERHEAD_MIB = 384
MEMORY_OVERHEAD_SHARE = 10

_SPARK_MEMORY_MIB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def pod_security_context() -> dict[str, Any]:
    """The pod-level hardening: the image's non-root user, RuntimeDefault seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": APP_UID,
        "runAsGroup": APP_UID,
        "fsGroup": APP_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """The container-level hardening: read-only root, no capabilities, no escalation."""
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def spark_memory_mib(spark_memory: str) -> int:
    """A Spark memory setting (``512m``, ``2g``, ``1gb``, either case; a bare number is MiB)
    in MiB."""
    text = spark_memory.strip().lower()
    if text[-2:-1] in _SPARK_MEMORY_MIB and text.endswith("b"):  # 512mb: 512m
        text = text[:-1]
    if text.isdigit():
        return int(text)
    unit, number = text[-1:], text[:-1]
    if unit not in _SPARK_MEMORY_MIB or not number.isdigit():
        raise ValueError(f"invalid Spark memory {spark_memory!r}")
    return max(1, int(int(number) * _SPARK_MEMORY_MIB[unit]))


def memory_overhead_mib(heap_mib: int) -> int:
    """Spark's default overhead of a JVM container: a tenth of the heap, at least 384 MiB."""
    return max(MIN_MEMORY_OVERHEAD_MIB, heap_mib // MEMORY_OVERHEAD_SHARE)


def container_resources(
    *, cpu_request: str | None, cpu_limit: str | None, cores: int, memory_mib: int
) -> dict[str, dict[str, str]]:
    """Requests and limits of a Spark container.

    CPU: the request given, else Spark's cores (a whole number for Spark; the pod may ask for
    less, e.g. ``500m`` for a light query on a small node); a limit only when given.
    Memory: the heap plus Spark's overhead (``memory_mib``), as request and limit.
    """
    memory = f"{memory_mib}Mi"
    limits = {"memory": memory} | ({"cpu": cpu_limit} if cpu_limit else {})
    return {"requests": {"cpu": cpu_request or str(cores), "memory": memory}, "limits": limits}


def secret_dir(side: str) -> str:
    """Where the Secret of the source or sink is mounted (driver and executors)."""
    return f"{SECRETS_DIR}/{side}"


def kafka_secret_volumes(
    pipeline: ExactlyOncePipeline,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The volumes and read-only mounts of the Kafka Secrets the pipeline names."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
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
    return volumes, mounts


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
