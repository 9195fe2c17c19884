"""Names and labels of a pipeline's children: one place, so every part agrees."""

from __future__ import annotations

from typing import Any

from eop_operator import API_VERSION, KIND
from eop_operator.api.models import ExactlyOncePipeline

#: Label carrying the pipeline name on every child (and the driver pod).
PIPELINE_LABEL = "exactlyonce.io/pipeline"
#: Annotation prefix used by the operator on children and pod templates.
ANNOTATION_PREFIX = "exactlyonce.io"
SPEC_HASH_ANNOTATION = f"{ANNOTATION_PREFIX}/spec-hash"
RESTART_NONCE_ANNOTATION = f"{ANNOTATION_PREFIX}/restart-nonce"
GENERATION_ANNOTATION = f"{ANNOTATION_PREFIX}/checkpoint-generation"
#: On a driver pod template: the executors its driver starts (executors on Kubernetes).
EXECUTORS_ANNOTATION = f"{ANNOTATION_PREFIX}/executors"
#: On every child the operator applies: the hash of what it rendered (reconcile.children).
RENDERED_HASH_ANNOTATION = f"{ANNOTATION_PREFIX}/rendered-hash"
MANAGED_BY = "eop-operator"
#: The label saying which controller manages an object (``MANAGED_BY`` on eop's children).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"


def config_map_name(pipeline: ExactlyOncePipeline) -> str:
    """The ConfigMap holding the resolved run configuration."""
    return f"{pipeline.metadata.name}-config"


def checkpoint_claim_name(pipeline: ExactlyOncePipeline) -> str:
    """The PersistentVolumeClaim of the checkpoint."""
    return f"{pipeline.metadata.name}-checkpoint"


def checkpoint_deletion_job_name(pipeline: ExactlyOncePipeline) -> str:
    """The Job that deletes a checkpoint in object storage (retention Delete)."""
    return f"{pipeline.metadata.name}-checkpoint-delete"


def driver_name(pipeline: ExactlyOncePipeline) -> str:
    """The driver StatefulSet, its headless Service and (when created) its ServiceAccount."""
    return f"{pipeline.metadata.name}-driver"


def driver_pod_name(pipeline: ExactlyOncePipeline) -> str:
    """The one driver pod of the StatefulSet."""
    return f"{driver_name(pipeline)}-0"


def rpc_secret_name(pipeline: ExactlyOncePipeline) -> str:
    """The Secret holding the key of the pipeline's Spark RPC (executors on Kubernetes)."""
    return f"{pipeline.metadata.name}-spark-rpc"


def executor_labels(pipeline: ExactlyOncePipeline) -> dict[str, str]:
    """Labels of the executor pods (Spark adds its own).

    Not the driver's selector labels: the StatefulSet, the Service and the operator's
    look at the driver select by those, and must never see an executor.
    """
    return {
        "app.kubernetes.io/name": "eop-executor",
        "app.kubernetes.io/instance": pipeline.metadata.name,
        "app.kubernetes.io/component": "executor",
        PIPELINE_LABEL: pipeline.metadata.name,
    }


def executor_selector(pipeline: ExactlyOncePipeline) -> str:
    """The label selector of the pipeline's executor pods, as a string (``status``, kubectl)."""
    return ",".join(f"{key}={value}" for key, value in executor_labels(pipeline).items())


def selector_labels(pipeline: ExactlyOncePipeline) -> dict[str, str]:
    """Labels selecting the driver pod (immutable once the StatefulSet exists)."""
    return {
        "app.kubernetes.io/name": "eop-pipeline",
        "app.kubernetes.io/instance": pipeline.metadata.name,
        PIPELINE_LABEL: pipeline.metadata.name,
    }


def common_labels(pipeline: ExactlyOncePipeline, component: str) -> dict[str, str]:
    """Labels on every child: selector labels plus component and manager."""
    return {
        **selector_labels(pipeline),
        "app.kubernetes.io/component": component,
        MANAGED_BY_LABEL: MANAGED_BY,
    }


def owner_reference(pipeline: ExactlyOncePipeline) -> dict[str, Any]:
    """The controller ownerReference that lets the garbage collector remove children."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": pipeline.metadata.name,
        "uid": pipeline.metadata.uid or "",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(
    pipeline: ExactlyOncePipeline, name: str, component: str, *, owned: bool = True
) -> dict[str, Any]:
    """Metadata of a child object: name, namespace, labels and (normally) the owner."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": pipeline.metadata.namespace,
        "labels": common_labels(pipeline, component),
    }
    if owned and pipeline.metadata.uid:
        meta["ownerReferences"] = [owner_reference(pipeline)]
    return meta
