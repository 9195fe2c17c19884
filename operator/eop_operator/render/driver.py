"""The driver: a one-replica StatefulSet running ``eop run``, and its headless Service.

A StatefulSet, not a Deployment, because it never runs two pods of one
identity: on an update it deletes the old pod before creating the new one,
and it keeps the driver up while the operator itself is down.
"""

from __future__ import annotations

from typing import Any

from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.render.executors import (
    EXECUTOR_TEMPLATE_KEY,
    executor_spark_conf,
    pod_ip_env,
    rpc_secret_volume,
)
from eop_operator.render.naming import (
    EXECUTORS_ANNOTATION,
    GENERATION_ANNOTATION,
    RESTART_NONCE_ANNOTATION,
    checkpoint_claim_name,
    child_metadata,
    common_labels,
    config_map_name,
    driver_name,
    driver_pod_name,
    selector_labels,
)
from eop_operator.render.pods import (
    checkpoint_credentials_env,
    container_resources,
    container_security_context,
    kafka_secret_volumes,
    memory_overhead_mib,
    node_placement,
    pod_security_context,
    spark_memory_mib,
)
from eop_operator.render.ports import (
    DriverPorts,
    HostPortRange,
    driver_ports,
    preferred_host_port,
)
from eop_spark.contract.run_config import CONFIG_FILE_NAME, SCRATCH_ENV

CONFIG_DIR = "/etc/eop"
CHECKPOINT_MOUNT = "/var/lib/eop/checkpoint"
#: Slack on top of one trigger interval plus the transaction timeout.
GRACE_SLACK_SECONDS = 30


def driver_container_memory_mib(pipeline: ExactlyOncePipeline) -> int:
    """Heap plus Spark's default overhead (10 %, at least 384 MiB)."""
    heap = spark_memory_mib(pipeline.spec.spark.driver.memory)
    return heap + memory_overhead_mib(heap)


def termination_grace_seconds(pipeline: ExactlyOncePipeline) -> int:
    """Long enough for the batch in flight to commit: one interval plus the txn timeout."""
    interval_ms = pipeline.spec.trigger.interval.ms
    timeout_ms = pipeline.spec.sink.kafka.transaction_timeout.ms
    return (interval_ms + timeout_ms) // 1000 + GRACE_SLACK_SECONDS


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
    executor = pipeline.spec.spark.executor
    return (
        conf
        | {
            "spark.kubernetes.namespace": pipeline.metadata.namespace,
            "spark.kubernetes.container.image": image,
            # Spark makes the driver pod its executors' owner: they go with it.
            "spark.kubernetes.driver.pod.name": driver_pod_name(pipeline),
            # spark.driver.host: the pod's IP (render.executors.pod_ip_env), not the headless
            # Service's name, which needs cluster DNS.
            "spark.driver.port": str(ports.driver_rpc),
            "spark.driver.blockManager.port": str(ports.block_manager),
            # Executors' too: on the node's network a fixed port is a host port, and two
            # executors on one node could not both hold it.
            "spark.blockManager.port": str(ports.block_manager),
            "spark.executor.instances": str(executor.instances),
            "spark.executor.cores": str(executor.cores),
            "spark.executor.memory": executor.memory,
        }
        | executor_spark_conf(pipeline, f"{CONFIG_DIR}/{EXECUTOR_TEMPLATE_KEY}")
    )


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
    kafka_volumes, kafka_mounts = kafka_secret_volumes(pipeline)
    volumes += kafka_volumes
    mounts += kafka_mounts
    if pipeline.spec.spark.on_kubernetes:
        rpc_volume, rpc_mount = rpc_secret_volume(pipeline)
        volumes.append(rpc_volume)
        mounts.append(rpc_mount)
    volumes.extend(pipeline.spec.driver.volumes)
    mounts.extend(pipeline.spec.driver.volume_mounts)
    return volumes, mounts


def driver_resources(pipeline: ExactlyOncePipeline) -> dict[str, dict[str, str]]:
    """Requests and limits of the driver container (``spec.driver.resources``)."""
    cpu = pipeline.spec.driver.resources
    return container_resources(
        cpu_request=cpu.requests.cpu,
        cpu_limit=cpu.limits.cpu,
        cores=pipeline.spec.spark.driver.cores,
        memory_mib=driver_container_memory_mib(pipeline),
    )


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
            # Executors reach the driver at its pod IP: no cluster DNS needed, and reachable
            # before the driver is Ready.
            *(pod_ip_env() if pipeline.spec.spark.on_kubernetes else []),
            *pipeline.spec.driver.env,
        ],
        "ports": container_ports,
        "resources": driver_resources(pipeline),
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(),
    }


def render_pod_template(
    pipeline: ExactlyOncePipeline, image: str, generation: int, ports: DriverPorts | None = None
) -> dict[str, Any]:
    """The driver pod template (without the spec-hash annotation, added by the caller)."""
    ports = ports or default_driver_ports(pipeline)
    volumes, _ = _volumes(pipeline)
    driver = pipeline.spec.driver
    annotations = {**driver.annotations, GENERATION_ANNOTATION: str(generation)}
    if pipeline.spec.spark.on_kubernetes:
        annotations[EXECUTORS_ANNOTATION] = str(pipeline.spec.spark.executor.instances)
    if pipeline.spec.restart_nonce:
        annotations[RESTART_NONCE_ANNOTATION] = pipeline.spec.restart_nonce
    pod_spec: dict[str, Any] = {
        "containers": [_container(pipeline, image, ports)],
        "volumes": volumes,
        "terminationGracePeriodSeconds": termination_grace_seconds(pipeline),
        "securityContext": pod_security_context(),
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
