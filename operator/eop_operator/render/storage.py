"""The run configuration ConfigMap and the checkpoint PersistentVolumeClaim."""

from __future__ import annotations

from typing import Any

from eop_operator.api.models import ExactlyOncePipeline, Retention
from eop_operator.render.naming import checkpoint_claim_name, child_metadata, config_map_name
from eop_spark.config import CONFIG_FILE_NAME, RunConfig


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
