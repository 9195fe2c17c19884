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
#: On every child the operator applies: the hash of what it rendered (reconcile.children).
RENDERED_HASH_ANNOTATION = f"{ANNOTATION_PREFIX}/rendered-hash"
MANAGED_BY = "eop-operator"


def config_map_name(pipeline: ExactlyOncePipeline) -> str:
    """The ConfigMap holding the resolved run configuration."""
    return f"{pipeline.metadata.name}-config"


def checkpoint_claim_name(pipeline: ExactlyOncePipeline) -> str:
    """The PersistentVolumeClaim of the checkpoint."""
    return f"{pipeline.metadata.name}-checkpoint"


def driver_name(pipeline: ExactlyOncePipeline) -> str:
    """The driver StatefulSet, its headless Service and (when created) its ServiceAccount."""
    return f"{pipeline.metadata.name}-driver"


def driver_pod_name(pipeline: ExactlyOncePipeline) -> str:
    """The one driver pod of the StatefulSet."""
    return f"{driver_name(pipeline)}-0"


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
        "app.kubernetes.io/managed-by": MANAGED_BY,
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
