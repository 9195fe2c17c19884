"""kopf wiring: thin handlers that validate, render, apply and report.

Decisions live in ``reconcile`` and rendering in ``render`` (both pure); this
module only moves data between kopf, the API server and those functions.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from eop_operator import GROUP, KIND, PLURAL, VERSION
from eop_operator.api.load import InvalidPipeline, load_pipeline, plain
from eop_operator.api.models import ExactlyOncePipeline, Retention
from eop_operator.api.resolve import resolve_identity
from eop_operator.kube.client import KubeClient
from eop_operator.kube.events import post_event
from eop_operator.kube.observed import OWN_WRITES, Observed, PipelineKey, pipeline_key, slim
from eop_operator.lifecycle import Renderer, drive, due, forget, quiesce
from eop_operator.reconcile.admission import (
    Claimant,
    IdentityTaken,
    claimed_identities,
    identity_conflict,
    identity_keys,
    shipped_transform_problem,
)
from eop_operator.render import (
    MissingImage,
    RenderedPipeline,
    checkpoint_root,
    render_pipeline,
)
from eop_operator.render.naming import (
    MANAGED_BY,
    PIPELINE_LABEL,
    checkpoint_deletion_job_name,
)
from eop_operator.render.pod_policy import PodPolicy, check_pod_policy
from eop_operator.render.ports import (
    HostPortRange,
    HostPortsExhausted,
    assign_metrics_host_port,
    metrics_host_port_of,
)
from eop_operator.render.rbac import DEFAULT_DRIVER_ROLE, DriverRole
from eop_operator.render.storage import render_checkpoint_deletion_job

FINALIZER = f"{GROUP}/finalizer"
#: Annotation prefix for kopf's own bookkeeping on our objects.
KOPF_PREFIX = f"kopf.{GROUP}"
#: How often each pipeline's timer asks whether its next look is due (lifecycle.due).
TIMER_SECONDS = 5.0
#: After a failed lifecycle step (an API error), the next try; kopf's default is 60 s, and
#: while an upgrade waits for its own apply no event would come to drive it sooner.
RETRY_SECONDS = 5.0

#: What the operator manages carries this label; its watches see nothing else.
MANAGED = {"app.kubernetes.io/managed-by": MANAGED_BY}
DRIVER_POD = {**MANAGED, "app.kubernetes.io/component": "driver"}
#: The watched kinds the lifecycle reads (group, version, plural), besides the pipelines.
STATEFULSETS = ("apps", "v1", "statefulsets")
PODS = ("", "v1", "pods")
CLAIMS = ("", "v1", "persistentvolumeclaims")
CONFIG_MAPS = ("", "v1", "configmaps")
SERVICES = ("", "v1", "services")
SERVICE_ACCOUNTS = ("", "v1", "serviceaccounts")
ROLE_BINDINGS = ("rbac.authorization.k8s.io", "v1", "rolebindings")
WATCHED = (STATEFULSETS, PODS, CLAIMS, CONFIG_MAPS, SERVICES, SERVICE_ACCOUNTS, ROLE_BINDINGS)


@dataclass
class OperatorOptions:
    """Settings given on the ``eop operator`` command line."""

    default_image: str | None = None
    #: Where host-network drivers get their metrics port (``--host-ports``).
    host_ports: HostPortRange = field(default_factory=HostPortRange)
    #: The pre-made role drivers with executors on Kubernetes are bound to (``--driver-role``).
    driver_role: DriverRole = DEFAULT_DRIVER_ROLE
    #: Node access pipelines may ask for (``--allow-host-network``, ``--allow-host-path-volumes``).
    pod_policy: PodPolicy = field(default_factory=PodPolicy)


#: Set by the CLI before kopf starts; read by the startup handler.
OPTIONS = OperatorOptions()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def connection_info(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo:
    """The in-cluster service account (API server from the service env), else the kubeconfig."""
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
    return connection_info(settings)


class NoDiffBase(kopf.DiffBaseStorage):
    """No record of a pipeline's last handled spec: the operator has no spec-change handlers.

    The lifecycle compares the spec's fingerprint with ``status.appliedFingerprint`` itself
    (level-based), so kopf need not keep the last handled spec in an annotation: that was a
    second write to every new pipeline, and to every spec change.  kopf also built the
    record's "essence" from a deep copy of every body of every watched object, status and
    managedFields included: most of the operator's CPU in a burst of new pipelines.
    """

    def build(
        self,
        *,
        body: kopf.Body,
        extra_fields: Iterable[str | tuple[str, ...] | list[str] | None] | None = None,
    ) -> kopf.BodyEssence:
        """Nothing to compare."""
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        """Nothing recorded."""
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """Nothing to record."""


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Keep kopf's state on our own keys, post only warnings as events, open the client."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = NoDiffBase()
    # Our events are posted by kube.events; kopf posts only its own warnings and errors.
    settings.posting.level = logging.WARNING
    # Least privilege: no cluster-wide CRD or namespace listing; resources are named explicitly.
    settings.scanning.disabled = True
    # Server-side: the namespace's other pods, ConfigMaps... never reach the operator.
    for resource in WATCHED:
        settings.watching.label_selectors[resource] = ",".join(
            f"{k}={v}" for k, v in MANAGED.items()
        )
    settings.watching.server_timeout = 270
    # A deleted pipeline waits for its timer and health daemon to stop.  kopf gives them a
    # few event-loop cycles, then looks again only every 60 s: a timer caught mid-step made
    # `kubectl delete` take a minute.  Wait a moment for them, and look again every 2 s.
    settings.background.instant_exit_timeout = 0.5
    settings.background.cancellation_polling = 2.0
    memo.client = KubeClient(lambda: connection_info(settings))
    memo.options = OPTIONS


#: How long the operator's exit waits for lifecycle steps under way.
QUIESCE_SECONDS = 10.0


@kopf.on.cleanup()
async def close(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Let the lifecycle steps under way finish, then close the HTTP session."""
    if not await quiesce(QUIESCE_SECONDS):
        logger.warning("a lifecycle step outlasted %ss at exit", QUIESCE_SECONDS)
    await memo.client.close()


def _by_pipeline(body: kopf.Body) -> dict[PipelineKey, dict[str, Any]]:
    key = pipeline_key(body)
    return {key: slim(body)} if key is not None else {}


# What the lifecycle reads (kube.observed): a slim copy of each pipeline, and of each
# object the operator manages, by pipeline.  kopf fills every index before it runs a
# handler.  One index of all children: kopf keys an index by its function, whatever kinds
# feed it.
@kopf.index(GROUP, VERSION, PLURAL)
async def pipelines(body: kopf.Body, **_: Any) -> dict[PipelineKey, dict[str, Any]]:
    """Each pipeline as last seen."""
    return _by_pipeline(body)


@kopf.index(*STATEFULSETS, labels=MANAGED)
@kopf.index(*PODS, labels=DRIVER_POD)
@kopf.index(*CLAIMS, labels=MANAGED)
@kopf.index(*CONFIG_MAPS, labels=MANAGED)
@kopf.index(*SERVICES, labels=MANAGED)
@kopf.index(*SERVICE_ACCOUNTS, labels=MANAGED)
@kopf.index(*ROLE_BINDINGS, labels=MANAGED)
async def children(body: kopf.Body, **_: Any) -> dict[PipelineKey, dict[str, Any]]:
    """Each pipeline's children (and driver pods), every kind."""
    return _by_pipeline(body)


def _observed(kwargs: dict[str, Any]) -> Observed:
    """The lifecycle's view: the indices above and the operator's own writes."""
    return Observed(pipelines=kwargs["pipelines"], children=kwargs["children"])


@kopf.index(*STATEFULSETS, labels=MANAGED)
async def driver_host_ports(
    namespace: str | None, body: kopf.Body, **_: Any
) -> dict[str, list[int]]:
    """Per pipeline id, the metrics host port its driver StatefulSet holds (host network)."""
    pipeline = body.metadata.labels.get(PIPELINE_LABEL)
    template = body.get("spec", {}).get("template", {})
    port = metrics_host_port_of(template.get("spec", {}))
    return {f"{namespace}.{pipeline}": [port]} if pipeline and port is not None else {}


@kopf.index(GROUP, VERSION, PLURAL)
async def pipeline_identities(body: kopf.Body, **_: Any) -> dict[str, list[Claimant]]:
    """Per transactional id prefix and progress group, the pipelines that hold it."""
    return claimed_identities(body)


def _admit(pipeline: ExactlyOncePipeline, held: kopf.Index[str, list[Claimant]]) -> None:
    """Refuse what only the operator can check: a missing shipped transform, a taken identity."""
    problem = shipped_transform_problem(pipeline)
    if problem is not None:
        raise InvalidPipeline(problem)
    identity = resolve_identity(pipeline)
    meta = pipeline.metadata
    me = Claimant(meta.creation_timestamp or "", meta.namespace, meta.name)
    keys = [key for key in identity_keys(identity) if key in held]  # not the whole index
    holders = {key: [c for value in held[key] for c in value] for key in keys}
    conflict = identity_conflict(identity, me, holders)
    if conflict is not None:
        raise IdentityTaken(conflict)


def _renderer(
    held: kopf.Index[str, list[int]], identities: kopf.Index[str, list[Claimant]]
) -> Renderer:
    """Render with the operator's default image and the pipeline's metrics host port.

    What only the operator can check (see ``_admit``) is refused before anything is
    rendered, so nothing is created or changed for such a pipeline.
    """

    def render(pipeline: ExactlyOncePipeline, generation: int, reset: bool) -> RenderedPipeline:
        _admit(pipeline, identities)
        check_pod_policy(pipeline, OPTIONS.pod_policy)  # an InvalidPipeline: no driver
        port = None
        if pipeline.spec.driver.host_network:
            ports = {key: [p for value in held[key] for p in value] for key in held}
            port = assign_metrics_host_port(pipeline.pipeline_id, OPTIONS.host_ports, ports)
        return render_pipeline(
            pipeline,
            default_image=OPTIONS.default_image,
            generation=generation,
            metrics_host_port=port,
            reset_progress=reset,
            driver_role=OPTIONS.driver_role,
        )

    return render


async def _drive(
    memo: kopf.Memo,
    namespace: str,
    name: str,
    kwargs: dict[str, Any],
    pod: dict[str, Any] | None = None,
) -> None:
    render = _renderer(kwargs["driver_host_ports"], kwargs["pipeline_identities"])
    await drive(
        memo.client,
        _observed(kwargs),
        namespace,
        name,
        render,
        invalid=(HostPortsExhausted,),
        pod=pod,
    )


@kopf.on.event(GROUP, VERSION, PLURAL)
async def pipeline_changed(
    type: str | None, body: kopf.Body, memo: kopf.Memo, **kwargs: Any
) -> None:
    """A pipeline was created, changed, or listed at the start: check it, step its lifecycle.

    Level-based: the lifecycle compares the spec with what it applied, so every event of a
    pipeline comes here, and a step that would decide nothing new is skipped
    (``lifecycle.drive``, which also refuses an invalid pipeline, with an event and the
    status).  A deleted pipeline is ``finalize``'s.
    """
    if type == "DELETED":
        forget(_observed(kwargs), str(body.metadata.namespace), str(body.metadata.name))
        return
    if body.metadata.get("deletionTimestamp"):
        return
    if FINALIZER not in body.metadata.get("finalizers", []):
        # kopf adds it first (a patch that fails on a newer version): the event of that
        # patch comes back here.
        return
    await _drive(memo, str(body.metadata.namespace), str(body.metadata.name), kwargs)


@kopf.timer(
    GROUP,
    VERSION,
    PLURAL,
    interval=TIMER_SECONDS,
    initial_delay=TIMER_SECONDS,
    backoff=RETRY_SECONDS,
)
async def lifecycle_timer(meta: kopf.Meta, memo: kopf.Memo, **kwargs: Any) -> None:
    """Look at a pipeline when its last step asked to (timeouts, backoffs, periodic looks)."""
    if meta.namespace is None or meta.name is None or not due(meta.namespace, meta.name):
        return
    await _drive(memo, meta.namespace, meta.name, kwargs)


def _owner(body: kopf.Body) -> str | None:
    owner = next(
        (ref for ref in body.metadata.get("ownerReferences", []) if ref.get("kind") == KIND),
        None,
    )
    return None if owner is None else str(owner["name"])


@kopf.on.event(*STATEFULSETS, labels=MANAGED)
async def driver_changed(type: str | None, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """A driver StatefulSet changed: mirror its readiness, take the next lifecycle step."""
    if type == "DELETED":
        OWN_WRITES.forget(body)
    name, namespace = _owner(body), body.metadata.namespace
    if name is not None and namespace is not None:
        await _drive(memo, namespace, name, kwargs)


@kopf.on.event(*PODS, labels=DRIVER_POD)
async def driver_pod_changed(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """A driver pod changed (started, Ready, ended, gone): take the next lifecycle step."""
    name, namespace = body.metadata.labels.get(PIPELINE_LABEL), body.metadata.namespace
    if name is not None and namespace is not None:
        await _drive(memo, namespace, name, kwargs, pod=plain(body))


@kopf.on.event(*CLAIMS, labels=MANAGED)
@kopf.on.event(*CONFIG_MAPS, labels=MANAGED)
@kopf.on.event(*SERVICES, labels=MANAGED)
@kopf.on.event(*SERVICE_ACCOUNTS, labels=MANAGED)
@kopf.on.event(*ROLE_BINDINGS, labels=MANAGED)
async def child_changed(type: str | None, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """Another child was deleted or written: the lifecycle applies it again if out of sync.

    The echo of the operator's own apply changes nothing the lifecycle reads: no step.
    """
    if type == "DELETED":
        OWN_WRITES.forget(body)
    key = pipeline_key(body)
    if key is not None:
        await _drive(memo, *key, kwargs)


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


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def finalize(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Honour the checkpoint retention policy before the garbage collector runs, valid or not."""
    claim, retain = checkpoint_on_delete(plain(body))
    if claim is None:
        await finalize_object_storage(body, memo.client)
        return
    if not retain:
        await post_event(
            memo.client,
            body,
            type="Normal",
            reason="CheckpointDeleted",
            message=f"claim {claim} goes with the pipeline",
        )
        return
    client: KubeClient = memo.client
    namespace = str(body.metadata.namespace)
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


#: How often a pipeline being deleted looks at its checkpoint deletion Job.
DELETION_POLL_SECONDS = 5.0
#: How long to wait before looking at a failed checkpoint deletion Job again.
DELETION_FAILED_RETRY_SECONDS = 60.0


def _job_condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return dict(condition)
    return None


async def finalize_object_storage(body: kopf.Body, client: KubeClient) -> None:
    """Honour ``checkpoint.retention`` for a checkpoint in object storage.

    Retain keeps the objects. Delete runs a Job (``render_checkpoint_deletion_job``)
    with the pipeline's image and credentials, and holds the pipeline (kopf retries this
    handler) until the Job has succeeded. A spec that no longer validates, an image or a
    pod policy that forbids the Job: the objects are kept and an event says so.
    """
    raw = plain(body)
    checkpoint = (raw.get("spec") or {}).get("checkpoint") or {}
    try:
        pipeline = load_pipeline(raw)
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
    image = pipeline.spec.image or OPTIONS.default_image
    try:
        check_pod_policy(pipeline, OPTIONS.pod_policy)
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
    owners = [o.get("uid") for o in ((job or {}).get("metadata") or {}).get("ownerReferences", [])]
    if job is not None and pipeline.metadata.uid not in owners:
        # An earlier pipeline's Job, which the garbage collector is about to delete.
        raise kopf.TemporaryError(f"waiting for an earlier Job {name} to go", delay=5)
    if job is None:
        await client.create(render_checkpoint_deletion_job(pipeline, image, root))
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
            f"({failed.get('reason')}: {failed.get('message')}); its pods' logs say why. Fix "
            "checkpoint.secretRef or checkpoint.options and delete the Job to try again, or "
            "set checkpoint.retention Retain to keep the checkpoint",
        )
        raise kopf.TemporaryError(f"Job {name} failed", delay=DELETION_FAILED_RETRY_SECONDS)
    raise kopf.TemporaryError(f"Job {name} deletes {root}", delay=DELETION_POLL_SECONDS)
