"""A pipeline being deleted: what honours its checkpoint's retention, planned (pure).

kopf holds a pipeline being deleted (its finalizer) until ``controller.finalizer`` lets it
go; :func:`plan_deletion` says what that takes, from the stored body as it is (a spec that
no longer validates included) and, for a checkpoint in object storage with retention
Delete, the deletion Job as found:

* a claim (``checkpoint.claim``): Delete lets the garbage collector take it with the
  pipeline; Retain (or anything unreadable: keeping is the safe side) removes the
  pipeline's owner reference from it first;
* object storage: Retain keeps the objects; Delete runs a Job with the pipeline's image and
  credentials and holds the pipeline until the Job has ended, which its retries and
  deadline bound.  A spec that no longer validates, an image or a pod policy that forbids
  the Job, a Job that failed or that the API server refuses, a Job of its name that is
  someone else's: the objects are kept, an event says so, and the pipeline goes (deletion
  never hangs a namespace).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from eop_operator import KIND
from eop_operator.api.load import InvalidPipeline, load_stored
from eop_operator.api.models import Retention
from eop_operator.reconcile.decision import Event
from eop_operator.render import MissingImage, checkpoint_root
from eop_operator.render.naming import checkpoint_deletion_job_name
from eop_operator.render.pod_policy import PodPolicy, check_pod_policy
from eop_operator.render.storage import render_checkpoint_deletion_job

#: How often a pipeline being deleted looks at its checkpoint deletion Job (seconds).
DELETION_POLL_SECONDS = 5.0
#: How long a pipeline waits for an earlier pipeline's Job of its name to go (seconds).
EARLIER_JOB_SECONDS = 5.0


class _Unread:
    """The deletion Job has not been read yet (the plan says whether it must be)."""


#: Pass as ``job`` before the Job was read.
UNREAD: Final = _Unread()


@dataclass(frozen=True, kw_only=True)
class DeletionPlan:
    """What lets a pipeline being deleted go, in the order ``controller.finalizer`` does it."""

    #: Read the deletion Job of this name and plan again with it.
    read_job: str | None = None
    #: Remove the pipeline's owner reference from this claim (Retain), before the events.
    release_claim: str | None = None
    #: Create this Job (Delete, object storage), before the events; if the API server
    #: refuses it for good, post :func:`job_refused` instead and let the pipeline go.
    create_job: dict[str, Any] | None = None
    #: Where the checkpoint is (for the messages).
    checkpoint: str = ""
    events: tuple[Event, ...] = ()
    #: Hold the pipeline and plan again in this many seconds (None: it may go).
    again_in: float | None = None
    #: Why it is held.
    held_for: str = ""


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
        return None, False  # object storage: no claim
    name = (body.get("metadata") or {}).get("name")
    # The name render.naming.checkpoint_claim_name gives (a test holds them equal).
    claim = f"{name}-checkpoint" if name else None
    return claim, checkpoint.get("retention") != Retention.DELETE.value


def release_patch(obj: Mapping[str, Any], pipeline_uid: str) -> dict[str, Any] | None:
    """The merge patch that removes the pipeline's ownerReference from ``obj`` and keeps every
    other one, or None when the pipeline does not own it.

    With ``obj``'s resourceVersion: a reference someone adds meanwhile is not lost (the patch
    is refused, and read and tried again).
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


def _kept(reason: str, message: str, warning: bool = True) -> DeletionPlan:
    kind = "Warning" if warning else "Normal"
    return DeletionPlan(events=(Event(type=kind, reason=reason, message=message),))


def claim_gone(claim: str) -> Event:
    """The event of a retained claim found gone (deleted with its namespace, or by hand)
    before the pipeline's reference to it was released: nothing is left to keep."""
    message = f"claim {claim} was deleted before the pipeline (with its namespace, or by hand)"
    return Event(type="Normal", reason="CheckpointGone", message=message)


def job_refused(checkpoint: str, error: str) -> Event:
    """The event of a deletion Job the API server refused for good (a namespace being
    deleted, the operator's rights in it gone): the checkpoint stays, the pipeline goes."""
    message = f"checkpoint {checkpoint} kept: no Job can delete it ({error[:300]})"
    return Event(type="Warning", reason="CheckpointRetained", message=message)


def _condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return dict(condition)
    return None


def plan_deletion(
    body: Mapping[str, Any],
    job: Mapping[str, Any] | _Unread | None,
    *,
    default_image: str | None,
    pod_policy: PodPolicy,
) -> DeletionPlan:
    """What lets the pipeline ``body`` (as stored, plain) go; see the module docstring.

    ``job``: the deletion Job as read (None: there is none), or :data:`UNREAD`.
    """
    claim, retain = checkpoint_on_delete(body)
    if claim is not None:
        if not retain:
            return _kept("CheckpointDeleted", f"claim {claim} goes with the pipeline", False)
        message = f"claim {claim} kept (retention Retain)"
        return DeletionPlan(
            release_claim=claim,
            events=(Event(type="Normal", reason="CheckpointRetained", message=message),),
        )
    try:
        pipeline = load_stored(body).value
    except InvalidPipeline as exc:
        uri = ((body.get("spec") or {}).get("checkpoint") or {}).get("uri")
        return _kept(
            "CheckpointRetained", f"checkpoint under {uri} kept: the spec is invalid ({exc})"
        )
    root = checkpoint_root(pipeline)
    if pipeline.spec.checkpoint.retention is not Retention.DELETE:
        return _kept("CheckpointRetained", f"checkpoint {root} kept (retention Retain)", False)
    image = pipeline.spec.image or default_image
    try:
        check_pod_policy(pipeline, pod_policy)
        if not image:
            raise MissingImage("spec.image is not set and the operator has no default image")
    except (InvalidPipeline, MissingImage) as exc:
        return _kept("CheckpointRetained", f"checkpoint {root} kept: no Job can delete it ({exc})")
    name = checkpoint_deletion_job_name(pipeline)
    if isinstance(job, _Unread):
        return DeletionPlan(read_job=name, checkpoint=root)
    deleting = f"Job {name} deletes {root}"
    if job is None:
        message = f"Job {name} deletes checkpoint {root} (retention Delete)"
        return DeletionPlan(
            create_job=render_checkpoint_deletion_job(pipeline, image, root),
            checkpoint=root,
            events=(Event(type="Normal", reason="CheckpointDeleting", message=message),),
            again_in=DELETION_POLL_SECONDS,
            held_for=deleting,
        )
    owners = (job.get("metadata") or {}).get("ownerReferences") or []
    if pipeline.metadata.uid not in [o.get("uid") for o in owners]:
        if any(o.get("kind") == KIND and o.get("name") == pipeline.metadata.name for o in owners):
            # An earlier pipeline's Job, which the garbage collector is about to delete.
            return DeletionPlan(
                again_in=EARLIER_JOB_SECONDS, held_for=f"waiting for an earlier Job {name} to go"
            )
        return _kept(
            "CheckpointRetained",
            f"checkpoint {root} kept: Job {name} exists and is not this pipeline's",
        )
    if _condition(job, "Complete") is not None:
        message = f"checkpoint {root} deleted by Job {name} (retention Delete)"
        return _kept("CheckpointDeleted", message, False)
    failed = _condition(job, "Failed")
    if failed is not None:
        return _kept(
            "CheckpointDeletionFailed",
            f"Job {name} could not delete checkpoint {root} "
            f"({failed.get('reason')}: {failed.get('message')}) after its retries; the "
            "checkpoint is kept and the pipeline goes. The Job's pods' logs say why; delete "
            f"the checkpoint with `eop checkpoint delete {root}` once that is fixed",
        )
    return DeletionPlan(again_in=DELETION_POLL_SECONDS, held_for=deleting)
