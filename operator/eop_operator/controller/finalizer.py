"""A pipeline being deleted: its checkpoint is kept or deleted as ``checkpoint.retention`` says.

kopf holds the pipeline (its finalizer) until :func:`honour_retention` returns; a
``kopf.TemporaryError`` has it called again after the delay it names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from eop_operator import KIND
from eop_operator.api.load import InvalidPipeline, load_stored, plain
from eop_operator.api.models import Retention
from eop_operator.controller.context import Context
from eop_operator.kube.client import KubeError
from eop_operator.kube.events import post_event
from eop_operator.render import MissingImage, checkpoint_root
from eop_operator.render.naming import checkpoint_deletion_job_name
from eop_operator.render.pod_policy import check_pod_policy
from eop_operator.render.storage import render_checkpoint_deletion_job


def checkpoint_on_delete(body: Mapping[str, Any]) -> tuple[str | None, bool]:
    """The checkpoint claim of a pipeline being deleted, and whether retention keeps it.

    Read from the raw body, so a spec that no longer validates (stored before a
    rule tightened, edited with validation off) keeps what its retention keeps.
    Anything unreadable counts as Retain: keeping a claim is the safe side.
    """
    spec = body.get("spec")
    checkpoint = spec.get("checkpoint") if isinstance(spec, Mapping) else None
    if not isinstance(checkpoint, Mapping):
        checkpoint = {}
    if checkpoint.get("uri"):
        return None, False  # object storage: no claim (see finalize_object_storage)
    name = (body.get("metadata") or {}).get("name")
    # The name render.naming.checkpoint_claim_name gives (a test holds them equal).
    claim = f"{name}-checkpoint" if name else None
    return claim, checkpoint.get("retention") != Retention.DELETE.value


def release_patch(obj: Mapping[str, Any], pipeline_uid: str) -> dict[str, Any] | None:
    """The merge patch that removes the pipeline's ownerReference from ``obj`` and keeps every
    other one, or None when the pipeline does not own it.

    With ``obj``'s resourceVersion: a reference someone adds meanwhile is not lost (the patch
    is refused, and the finalizer retried).
    """
    meta = obj.get("metadata") or {}
    refs = list(meta.get("ownerReferences") or [])
    kept = [ref for ref in refs if ref.get("uid") != pipeline_uid]
    if len(kept) == len(refs):
        return None
    return {
        "metadata": {
            "ownerReferences": kept or None,
            "resourceVersion": meta.get("resourceVersion"),
        }
    }


#: Reads and patches of a retained claim that changes meanwhile (HTTP 409) before giving up.
RELEASE_ATTEMPTS = 5
HTTP_CONFLICT = 409


async def honour_retention(context: Context, body: Mapping[str, Any]) -> None:
    """Honour the checkpoint retention policy before the garbage collector runs, valid or not."""
    claim, retain = checkpoint_on_delete(plain(body))
    if claim is None:
        await finalize_object_storage(context, body)
        return
    if not retain:
        await post_event(
            context.client,
            body,
            type="Normal",
            reason="CheckpointDeleted",
            message=f"claim {claim} goes with the pipeline",
        )
        return
    client = context.client
    namespace = str(body["metadata"]["namespace"])
    for attempt in range(1, RELEASE_ATTEMPTS + 1):
        found = await client.get("v1", "PersistentVolumeClaim", namespace, claim)
        patch = None if found is None else release_patch(found, str(body["metadata"].get("uid")))
        if patch is None:
            break
        try:
            # Without the pipeline as owner the garbage collector leaves the claim alone.
            await client.patch("v1", "PersistentVolumeClaim", namespace, claim, patch)
            break
        except KubeError as exc:
            # The claim changed since it was read (its protection finalizer, a namespace
            # being deleted): read it again now, not at kopf's next try a minute later.
            if exc.status != HTTP_CONFLICT or attempt == RELEASE_ATTEMPTS:
                raise
    await post_event(
        client,
        body,
        type="Normal",
        reason="CheckpointRetained",
        message=f"claim {claim} kept (retention Retain)",
    )


#: How often a pipeline being deleted looks at its checkpoint deletion Job.
DELETION_POLL_SECONDS = 5.0


def _job_condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return dict(condition)
    return None


async def finalize_object_storage(context: Context, body: Mapping[str, Any]) -> None:
    """Honour ``checkpoint.retention`` for a checkpoint in object storage.

    Retain keeps the objects. Delete runs a Job (``render_checkpoint_deletion_job``)
    with the pipeline's image and credentials, and holds the pipeline (kopf retries this
    handler) until the Job has ended, which its retries and deadline bound. A spec that no
    longer validates, an image or a pod policy that forbids the Job, a Job that failed or
    that the API server refuses, a Job of its name that is someone else's: the objects are
    kept, an event says so, and the pipeline goes (deletion never hangs a namespace).
    """
    client, options = context.client, context.options
    raw = plain(body)
    checkpoint = (raw.get("spec") or {}).get("checkpoint") or {}
    try:
        pipeline = load_stored(raw).value
    except InvalidPipeline as exc:
        await post_event(
            client,
            body,
            type="Warning",
            reason="CheckpointRetained",
            message=f"checkpoint under {checkpoint.get('uri')} kept: the spec is invalid ({exc})",
        )
        return
    root = checkpoint_root(pipeline)
    if pipeline.spec.checkpoint.retention is not Retention.DELETE:
        await post_event(
            client,
            body,
            type="Normal",
            reason="CheckpointRetained",
            message=f"checkpoint {root} kept (retention Retain)",
        )
        return
    image = pipeline.spec.image or options.default_image
    try:
        check_pod_policy(pipeline, options.pod_policy)
        if not image:
            raise MissingImage("spec.image is not set and the operator has no default image")
    except (InvalidPipeline, MissingImage) as exc:
        await post_event(
            client,
            body,
            type="Warning",
            reason="CheckpointRetained",
            message=f"checkpoint {root} kept: no Job can delete it ({exc})",
        )
        return
    namespace = pipeline.metadata.namespace
    name = checkpoint_deletion_job_name(pipeline)
    job = await client.get("batch/v1", "Job", namespace, name)
    owners = ((job or {}).get("metadata") or {}).get("ownerReferences", [])
    if job is not None and pipeline.metadata.uid not in [o.get("uid") for o in owners]:
        if any(o.get("kind") == KIND and o.get("name") == pipeline.metadata.name for o in owners):
            # An earlier pipeline's Job, which the garbage collector is about to delete.
            raise kopf.TemporaryError(f"waiting for an earlier Job {name} to go", delay=5)
        await post_event(
            client,
            body,
            type="Warning",
            reason="CheckpointRetained",
            message=f"checkpoint {root} kept: Job {name} exists and is not this pipeline's",
        )
        return
    if job is None:
        try:
            await client.create(render_checkpoint_deletion_job(pipeline, image, root))
        except KubeError as exc:
            if not 400 <= exc.status < 500:
                raise
            # Refused for good (the namespace is being deleted, the operator's rights in it
            # are gone): a pipeline never hangs its namespace; the checkpoint stays.
            await post_event(
                client,
                body,
                type="Warning",
                reason="CheckpointRetained",
                message=f"checkpoint {root} kept: no Job can delete it ({str(exc)[:300]})",
            )
            return
        await post_event(
            client,
            body,
            type="Normal",
            reason="CheckpointDeleting",
            message=f"Job {name} deletes checkpoint {root} (retention Delete)",
        )
        raise kopf.TemporaryError(f"Job {name} deletes {root}", delay=DELETION_POLL_SECONDS)
    if _job_condition(job, "Complete") is not None:
        await post_event(
            client,
            body,
            type="Normal",
            reason="CheckpointDeleted",
            message=f"checkpoint {root} deleted by Job {name} (retention Delete)",
        )
        return
    failed = _job_condition(job, "Failed")
    if failed is not None:
        await post_event(
            client,
            body,
            type="Warning",
            reason="CheckpointDeletionFailed",
            message=f"Job {name} could not delete checkpoint {root} "
            f"({failed.get('reason')}: {failed.get('message')}) after its retries; the "
            "checkpoint is kept and the pipeline goes. The Job's pods' logs say why; delete "
            f"the checkpoint with `eop checkpoint delete {root}` once that is fixed",
        )
        return
    raise kopf.TemporaryError(f"Job {name} deletes {root}", delay=DELETION_POLL_SECONDS)
