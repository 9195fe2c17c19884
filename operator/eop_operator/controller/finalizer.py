"""A pipeline being deleted: its checkpoint is kept or deleted as ``checkpoint.retention`` says.

kopf holds the pipeline (its finalizer) until :func:`honour_retention` returns; a
``kopf.TemporaryError`` has it called again after the delay it names.  What it takes is
planned in ``reconcile.deletion``; this module carries the plan out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from eop_operator.api.load import plain
from eop_operator.controller.context import Context
from eop_operator.kube.client import KubeClient, KubeError
from eop_operator.kube.events import post_event
from eop_operator.reconcile.deletion import (
    UNREAD,
    claim_gone,
    job_refused,
    plan_deletion,
    release_patch,
)

#: Reads and patches of a retained claim that changes meanwhile (HTTP 409) before giving up.
RELEASE_ATTEMPTS = 5
HTTP_CONFLICT = 409
HTTP_NOT_FOUND = 404


async def honour_retention(context: Context, body: Mapping[str, Any]) -> None:
    """Honour the checkpoint retention policy before the garbage collector runs, valid or not."""
    client, options, raw = context.client, context.options, plain(body)
    namespace = str(body["metadata"]["namespace"])
    image, policy = options.default_image, options.pod_policy
    plan = plan_deletion(raw, UNREAD, default_image=image, pod_policy=policy)
    if plan.read_job is not None:
        job = await client.get("batch/v1", "Job", namespace, plan.read_job)
        plan = plan_deletion(raw, job, default_image=image, pod_policy=policy)
    events, again_in = plan.events, plan.again_in
    if plan.release_claim is not None:
        uid = str(body["metadata"].get("uid"))
        if not await _release(context, namespace, plan.release_claim, uid):
            events = (claim_gone(plan.release_claim),)
    if plan.create_job is not None:
        try:
            await client.create(plan.create_job)
        except KubeError as exc:
            if not 400 <= exc.status < 500:
                raise
            # Refused for good: a pipeline never hangs its namespace; the checkpoint stays.
            events, again_in = (job_refused(plan.checkpoint, str(exc)),), None
    for event in events:
        await post_event(client, body, type=event.type, reason=event.reason, message=event.message)
    if again_in is not None:
        raise kopf.TemporaryError(plan.held_for, delay=again_in)


async def _release(context: Context, namespace: str, claim: str, pipeline_uid: str) -> bool:
    """Remove the pipeline's owner reference from its retained claim: without it the garbage
    collector leaves the claim alone. False: the claim is gone (deleted with its namespace,
    or by hand), nothing to release."""
    client = context.client
    for _ in range(RELEASE_ATTEMPTS - 1):
        try:
            return await _release_once(client, namespace, claim, pipeline_uid)
        except KubeError as exc:
            # The claim changed since it was read (its protection finalizer, a namespace
            # being deleted): read it again now, not at kopf's next try a minute later.
            if exc.status != HTTP_CONFLICT:
                raise
    return await _release_once(client, namespace, claim, pipeline_uid)


async def _release_once(client: KubeClient, namespace: str, claim: str, pipeline_uid: str) -> bool:
    """One read and patch of :func:`_release` (a conflict raises)."""
    found = await client.get("v1", "PersistentVolumeClaim", namespace, claim)
    if found is None:
        return False
    patch = release_patch(found, pipeline_uid)
    if patch is None:
        return True
    try:
        await client.patch("v1", "PersistentVolumeClaim", namespace, claim, patch)
    except KubeError as exc:
        if exc.status == HTTP_NOT_FOUND:  # deleted since it was read
            return False
        raise
    return True
