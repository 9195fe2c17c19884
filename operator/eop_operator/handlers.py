"""kopf wiring: thin handlers that validate, render, apply and report.

Decisions live in ``reconcile`` and rendering in ``render`` (both pure); this
module only moves data between kopf, the API server and those functions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any

import kopf
from pydantic import ValidationError

from eop_operator import API_VERSION, GROUP, KIND, PLURAL, VERSION
from eop_operator.api.load import InvalidPipeline, load_pipeline, plain
from eop_operator.api.models import PipelineStatus
from eop_operator.api.resolve import IdentityChanged, resolve_identity
from eop_operator.kube.client import KubeClient
from eop_operator.kube.events import post_event
from eop_operator.reconcile.status import DriverObservation, judge, ready_column, status_patch
from eop_operator.render import MissingImage, checkpoint_root, render_pipeline
from eop_operator.render.naming import MANAGED_BY, checkpoint_claim_name, driver_name
from eop_operator.render.storage import retains_checkpoint

FINALIZER = f"{GROUP}/finalizer"
#: Annotation prefix for kopf's own bookkeeping on our objects.
KOPF_PREFIX = f"kopf.{GROUP}"


@dataclass
class OperatorOptions:
    """Settings given on the ``eop operator`` command line."""

    default_image: str | None = None


#: Set by the CLI before kopf starts; read by the startup handler.
OPTIONS = OperatorOptions()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _login(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo:
    info = kopf.login_with_service_account(settings=settings)
    if info is not None:
        # Like client-go's in-cluster config: the service env names the API server.
        # kopf's default (kubernetes.default.svc) needs cluster DNS, which not every
        # cluster has for host-network pods.
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT")
        if host and port:
            host = f"[{host}]" if ":" in host else host
            info = dataclasses.replace(info, server=f"https://{host}:{port}")
        return info
    info = kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.PermanentError("no in-cluster service account and no kubeconfig found")
    return info


@kopf.on.login()
def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    """Authenticate with the in-cluster service account, else the kubeconfig."""
    return _login(settings)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Keep kopf's state on our own keys, post only warnings as events, open the client."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_PREFIX, key="last-handled-configuration"
    )
    # Our events are posted by kube.events; kopf posts only its own warnings and errors.
    settings.posting.level = logging.WARNING
    # Least privilege: no cluster-wide CRD or namespace listing; resources are named explicitly.
    settings.scanning.disabled = True
    settings.watching.server_timeout = 270
    memo.client = KubeClient(lambda: _login(settings))
    memo.options = OPTIONS


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    """Close the HTTP session."""
    await memo.client.close()


def _report(
    body: kopf.Body,
    patch: kopf.Patch,
    *,
    suspend: bool,
    driver: DriverObservation | None,
    error: str | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write phase and conditions into ``patch`` (kopf applies it after the handler)."""
    try:
        previous = PipelineStatus.model_validate(plain(body.get("status", {})))
    except ValidationError:
        previous = PipelineStatus()
    verdict = judge(suspend=suspend, driver=driver, error=error)
    patch.status.update(
        status_patch(
            verdict,
            previous=previous,
            generation=body.metadata.get("generation"),
            ready=ready_column(driver, suspend=suspend),
            now=_now(),
            extra=extra,
        )
    )


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
@kopf.on.resume(GROUP, VERSION, PLURAL)
async def reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Render the pipeline's children from its spec and apply them."""
    try:
        pipeline = load_pipeline(body)
        identity = resolve_identity(pipeline)
        generation = pipeline.status.checkpoint.generation if pipeline.status.checkpoint else 0
        rendered = render_pipeline(
            pipeline, default_image=memo.options.default_image, generation=generation
        )
    except (InvalidPipeline, IdentityChanged, MissingImage) as exc:
        await post_event(memo.client, body, type="Warning", reason="InvalidSpec", message=str(exc))
        _report(body, patch, suspend=False, driver=None, error=str(exc))
        raise kopf.PermanentError(str(exc)) from None

    client: KubeClient = memo.client
    # Everything the driver mounts or runs as goes first, concurrently; the StatefulSet last,
    # so its pod never starts without its ConfigMap and claim.
    *supporting, statefulset = rendered.objects
    await asyncio.gather(*(client.apply(obj) for obj in supporting))
    applied_statefulset = await client.apply(statefulset)
    _report(
        body,
        patch,
        suspend=pipeline.spec.suspend,
        driver=DriverObservation.from_statefulset(applied_statefulset),
        extra={
            "transactionalIdPrefix": identity.transactional_id_prefix,
            "progressGroup": identity.progress_group,
            "specHash": rendered.spec_hash,
            "checkpoint": {
                "generation": generation,
                "path": rendered.run_config.checkpoint_location,
            },
            "commitMode": pipeline.spec.sink.kafka.commit_mode.value,
        },
    )
    if pipeline.status.spec_hash != rendered.spec_hash:
        await post_event(
            client,
            body,
            type="Normal",
            reason="Applied",
            message=f"driver {driver_name(pipeline)} at spec hash {rendered.spec_hash}, "
            f"checkpoint generation {generation} ({checkpoint_root(pipeline)})",
        )


@kopf.index(GROUP, VERSION, PLURAL)
def pipeline_states(
    namespace: str | None, name: str | None, spec: kopf.Spec, status: kopf.Status, **_: Any
) -> dict[tuple[str | None, str | None], tuple[bool, Any, Any]]:
    """Suspension, phase and READY of every pipeline, kept in memory by kopf."""
    return {
        (namespace, name): (
            bool(spec.get("suspend", False)),
            status.get("phase"),
            status.get("ready"),
        )
    }


@kopf.on.event("apps", "v1", "statefulsets", labels={"app.kubernetes.io/managed-by": MANAGED_BY})
async def driver_changed(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """Mirror the driver StatefulSet's readiness into the pipeline's status."""
    pipeline_states: kopf.Index[Any, Any] = kwargs["pipeline_states"]
    owner = next(
        (ref for ref in body.metadata.get("ownerReferences", []) if ref.get("kind") == KIND),
        None,
    )
    if owner is None:
        return
    client: KubeClient = memo.client
    namespace = body.metadata.namespace
    assert namespace is not None
    driver = DriverObservation.from_statefulset(plain(body))
    for suspend, phase, ready in pipeline_states.get((namespace, owner["name"]), []):
        # Most StatefulSet events change nothing the status shows: skip the read.
        verdict = judge(suspend=suspend, driver=driver, error=None)
        if verdict.phase.value == phase and ready_column(driver, suspend=suspend) == ready:
            return
    current = await client.get(API_VERSION, KIND, namespace, owner["name"])
    if current is None or current["metadata"].get("deletionTimestamp"):
        return
    try:
        pipeline = load_pipeline(current)
    except InvalidPipeline:
        return  # reconcile has already reported it
    suspend = pipeline.spec.suspend
    verdict = judge(suspend=suspend, driver=driver, error=None)
    ready = ready_column(driver, suspend=suspend)
    if pipeline.status.phase == verdict.phase and pipeline.status.ready == ready:
        return
    status = status_patch(
        verdict,
        previous=pipeline.status,
        generation=pipeline.metadata.generation,
        ready=ready,
        now=_now(),
    )
    await client.patch(
        API_VERSION, KIND, namespace, owner["name"], {"status": status}, subresource="status"
    )


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def finalize(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Honour the checkpoint retention policy before the garbage collector runs."""
    try:
        pipeline = load_pipeline(body)
    except InvalidPipeline:
        return  # nothing was created for an invalid pipeline's checkpoint
    claim = checkpoint_claim_name(pipeline)
    if not retains_checkpoint(pipeline):
        await post_event(
            memo.client,
            body,
            type="Normal",
            reason="CheckpointDeleted",
            message=f"claim {claim} goes with the pipeline",
        )
        return
    client: KubeClient = memo.client
    namespace = pipeline.metadata.namespace
    if await client.get("v1", "PersistentVolumeClaim", namespace, claim) is not None:
        # Without an owner the garbage collector leaves the claim alone.
        await client.patch(
            "v1", "PersistentVolumeClaim", namespace, claim, {"metadata": {"ownerReferences": None}}
        )
    await post_event(
        client,
        body,
        type="Normal",
        reason="CheckpointRetained",
        message=f"claim {claim} kept (retention Retain)",
    )
