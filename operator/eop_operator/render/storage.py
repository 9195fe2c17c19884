"""The run configuration ConfigMap, the checkpoint claim and the checkpoint deletion Job."""

from __future__ import annotations

from typing import Any

from eop_operator.api.models import ExactlyOncePipeline, Retention
from eop_operator.render.naming import (
    checkpoint_claim_name,
    checkpoint_deletion_job_name,
    child_metadata,
    common_labels,
    config_map_name,
)
from eop_operator.render.pods import (
    checkpoint_credentials_env,
    container_security_context,
    node_placement,
    pod_security_context,
)
from eop_spark.contract.run_config import CONFIG_FILE_NAME, SCRATCH_ENV, RunConfig


def render_config_map(
    pipeline: ExactlyOncePipeline, run_config: RunConfig, files: dict[str, str] | None = None
) -> dict[str, Any]:
    """The ConfigMap the driver reads its run configuration from (no secret values in it).

    ``files``: more of what the driver reads, by file name (the executor pod template).
    """
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(pipeline, config_map_name(pipeline), "config"),
        "data": {
            CONFIG_FILE_NAME: run_config.model_dump_json(
                by_alias=True, exclude_none=True, indent=2
            ),
            **(files or {}),
        },
    }


def render_checkpoint_claim(pipeline: ExactlyOncePipeline) -> dict[str, Any] | None:
    """The checkpoint PVC, or None when the checkpoint lives at a URI.

    The claim is owned by the pipeline in both retention modes; with Retain the
    finalizer removes the ownerReference before the pipeline goes, so the
    garbage collector leaves the claim (and a pipeline re-created under the
    same name resumes from it).
    """
    claim = pipeline.spec.checkpoint.claim
    if claim is None:
        return None
    spec: dict[str, Any] = {
        "accessModes": [mode.value for mode in claim.access_modes],
        "resources": {"requests": {"storage": claim.size}},
    }
    if claim.storage_class_name is not None:
        spec["storageClassName"] = claim.storage_class_name
    metadata = child_metadata(pipeline, checkpoint_claim_name(pipeline), "checkpoint")
    metadata["annotations"] = {
        "exactlyonce.io/retention": pipeline.spec.checkpoint.retention.value,
    }
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec}


def retains_checkpoint(pipeline: ExactlyOncePipeline) -> bool:
    """Whether deleting the pipeline keeps its checkpoint claim."""
    return (
        pipeline.spec.checkpoint.claim is not None
        and pipeline.spec.checkpoint.retention is Retention.RETAIN
    )


#: What the checkpoint deletion Job may take: a Spark session in one JVM, a few requests.
_DELETION_MEMORY = "1Gi"
#: How long the deletion may run before the Job fails (and is retried, up to the backoff limit).
DELETION_DEADLINE_SECONDS = 600


def render_checkpoint_deletion_job(
    pipeline: ExactlyOncePipeline, image: str, root: str
) -> dict[str, Any]:
    """The Job that deletes a checkpoint in object storage (retention Delete), or raises.

    It runs ``eop checkpoint delete <root>`` in the pipeline's Spark image, with the
    object store's settings as arguments and its credentials as the driver has them
    (environment variables from ``checkpoint.secretRef``, or the ServiceAccount's web
    identity): the operator itself never holds them. Hardened like the driver, placed like
    it; owned by the pipeline, so it goes with it.
    """
    options = [f"--option={k}={v}" for k, v in sorted(pipeline.spec.checkpoint.options.items())]
    container = {
        "name": "delete",
        "image": image,
        "imagePullPolicy": pipeline.spec.image_pull_policy.value,
        "args": ["checkpoint", "delete", root, *options],
        "workingDir": "/tmp",
        "env": [
            {"name": "HOME", "value": "/tmp"},
            {"name": SCRATCH_ENV, "value": "/tmp/spark"},
            *checkpoint_credentials_env(pipeline),
        ],
        "resources": {
            "requests": {"cpu": "100m", "memory": _DELETION_MEMORY},
            "limits": {"memory": _DELETION_MEMORY},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(),
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
        "securityContext": pod_security_context(),
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        **node_placement(pipeline),
    }
    labels = common_labels(pipeline, "checkpoint-deletion")
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": child_metadata(
            pipeline, checkpoint_deletion_job_name(pipeline), "checkpoint-deletion"
        ),
        "spec": {
            "backoffLimit": 3,
            "activeDeadlineSeconds": DELETION_DEADLINE_SECONDS,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
