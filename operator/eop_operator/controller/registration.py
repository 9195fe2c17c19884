"""kopf wiring: which kinds the operator watches and which handler each event reaches.

Nothing registers itself on import: the CLI makes a registry, calls
:func:`register`, configures kopf's settings (:func:`configure`) and gives
kopf a memo from :func:`memo` (the :class:`~eop_operator.controller.context.Context`,
the :class:`~eop_operator.controller.lifecycle.Lifecycle` and the
:class:`~eop_operator.controller.health_monitor.HealthMonitor` of this run).

The handlers are thin.  The watches' indices keep a slim copy of each pipeline
and child (``kube.observed``); every event of a pipeline, of a child or of a
driver pod, and each pipeline's timer, takes the lifecycle's next step; a
daemon per pipeline runs its health checks; a finalizer honours the
checkpoint retention policy (``controller.finalizer``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable
from typing import Any

import kopf

from eop_operator import API_VERSION, GROUP, KIND, PLURAL, VERSION
from eop_operator.api.load import plain
from eop_operator.controller.cluster_gate import ClusterGate
from eop_operator.controller.context import Context, OperatorOptions
from eop_operator.controller.finalizer import honour_retention
from eop_operator.controller.health_monitor import HealthMonitor
from eop_operator.controller.lifecycle import Lifecycle
from eop_operator.controller.rbac_guard import RbacGuard
from eop_operator.controller.renderer import renderer
from eop_operator.kube.observed import Observed, PipelineKey, pipeline_key, slim
from eop_operator.reconcile.admission import Claimant, claimed_identities
from eop_operator.reconcile.cadence import RETRY_SECONDS, TIMER_SECONDS
from eop_operator.render.naming import MANAGED_BY, MANAGED_BY_LABEL, PIPELINE_LABEL
from eop_operator.render.ports import HostPortsExhausted, metrics_host_port_of

FINALIZER = f"{GROUP}/finalizer"
#: Annotation prefix of kopf's own records on our objects (its "progress storage": which
#: handlers ran; nothing to do with the progress group).
KOPF_PREFIX = f"kopf.{GROUP}"
#: How long the operator's exit waits for lifecycle steps under way.
QUIESCE_SECONDS = 10.0

#: What the operator manages carries this label; its watches see nothing else.
MANAGED = {MANAGED_BY_LABEL: MANAGED_BY}
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
#: The children whose events only make the lifecycle apply them again (when out of sync).
OTHER_CHILDREN = (CLAIMS, CONFIG_MAPS, SERVICES, SERVICE_ACCOUNTS, ROLE_BINDINGS)


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


def configure(settings: kopf.OperatorSettings) -> None:
    """Keep kopf's records on our own keys, post only its warnings, watch only what we manage."""
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


def memo(options: OperatorOptions, settings: kopf.OperatorSettings) -> kopf.Memo:
    """What every handler of this run shares: the context, the lifecycle, the health monitor."""
    context = Context.open(options, lambda: connection_info(settings))
    name = options.rbac_name
    return kopf.Memo(
        context=context,
        lifecycle=Lifecycle(context, ClusterGate(context)),
        health=HealthMonitor(context),
        guard=RbacGuard(context.client, name) if name else None,
    )


def _context(memo: kopf.Memo) -> Context:
    context: Context = memo.context
    return context


def _lifecycle(memo: kopf.Memo) -> Lifecycle:
    lifecycle: Lifecycle = memo.lifecycle
    return lifecycle


def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    """Authenticate with the in-cluster service account, else the kubeconfig."""
    return connection_info(settings)


async def started(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Say, once kopf has started, what this run serves pipelines with."""
    options = _context(memo).options
    policy = options.pod_policy
    logger.info(
        "default image %s, metrics host ports %s, driver role %s, host network %s, "
        "hostPath volumes %s, service accounts %s",
        options.default_image or "(none)",
        options.host_ports,
        options.driver_role,
        "allowed" if policy.allow_host_network else "refused",
        "allowed" if policy.allow_host_path_volumes else "refused",
        ", ".join(sorted(policy.service_accounts)) or "only eop's",
    )


async def close(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Let the lifecycle steps under way finish, then close the HTTP session."""
    if not await _lifecycle(memo).quiesce(QUIESCE_SECONDS):
        logger.warning("a lifecycle step outlasted %ss at exit", QUIESCE_SECONDS)
    await _context(memo).client.close()


def _by_pipeline(body: kopf.Body) -> dict[PipelineKey, dict[str, Any]]:
    key = pipeline_key(body)
    return {key: slim(body)} if key is not None else {}


# What the lifecycle reads (kube.observed): a slim copy of each pipeline, and of each
# object the operator manages, by pipeline.  kopf fills every index before it runs a
# handler.  One index of all children: kopf keys an index by its function, whatever kinds
# feed it (and passes it to handlers under the function's name).
async def pipelines(body: kopf.Body, **_: Any) -> dict[PipelineKey, dict[str, Any]]:
    """Each pipeline as last seen."""
    return _by_pipeline(body)


async def children(body: kopf.Body, **_: Any) -> dict[PipelineKey, dict[str, Any]]:
    """Each pipeline's children (and driver pods), every kind."""
    return _by_pipeline(body)


async def driver_host_ports(
    namespace: str | None, body: kopf.Body, **_: Any
) -> dict[str, list[int]]:
    """Per pipeline id, the metrics host port its driver StatefulSet holds (host network)."""
    pipeline = body.metadata.labels.get(PIPELINE_LABEL)
    template = body.get("spec", {}).get("template", {})
    port = metrics_host_port_of(template.get("spec", {}))
    return {f"{namespace}.{pipeline}": [port]} if pipeline and port is not None else {}


async def pipeline_identities(body: kopf.Body, **_: Any) -> dict[str, list[Claimant]]:
    """Per transactional id prefix and progress group, the pipelines that hold it."""
    return claimed_identities(body)


async def _drive(
    memo: kopf.Memo, key: PipelineKey, kwargs: dict[str, Any], pod: dict[str, Any] | None = None
) -> None:
    """Take the lifecycle's next steps for the pipeline ``key``, reading the indices above."""
    context = _context(memo)
    observed = Observed(
        pipelines=kwargs["pipelines"], children=kwargs["children"], own=context.own_writes
    )
    render = renderer(context.options, kwargs["driver_host_ports"], kwargs["pipeline_identities"])
    await _lifecycle(memo).drive(observed, key, render, invalid=(HostPortsExhausted,), pod=pod)


async def pipeline_changed(
    type: str | None, body: kopf.Body, memo: kopf.Memo, **kwargs: Any
) -> None:
    """A pipeline was created, changed, or listed at the start: check it, step its lifecycle.

    Level-based: the lifecycle compares the spec with what it applied, so every event of a
    pipeline comes here, and a step that would decide nothing new is skipped
    (``Lifecycle.drive``, which also refuses an invalid pipeline, with an event and the
    status).  A deleted pipeline is ``finalize``'s.
    """
    key = (str(body.metadata.namespace), str(body.metadata.name))
    guard: RbacGuard | None = memo.get("guard")
    if type == "DELETED":
        lifecycle = _lifecycle(memo)
        lifecycle.forget(key)
        if lifecycle.gate is not None:
            lifecycle.gate.forget(key)
        if guard is not None:  # the namespace's last pipeline: its rights there may go
            await guard.release(key[0], API_VERSION, KIND)
        return
    if body.metadata.get("deletionTimestamp"):
        return
    if FINALIZER not in body.metadata.get("finalizers", []):
        # kopf adds it first (a patch that fails on a newer version): the event of that
        # patch comes back here.
        return
    if guard is not None:  # before anything is created for the pipeline
        await guard.hold(key[0])
    await _drive(memo, key, kwargs)


async def lifecycle_timer(meta: kopf.Meta, memo: kopf.Memo, **kwargs: Any) -> None:
    """Look at a pipeline when its last step asked to (see ``reconcile.cadence``)."""
    if meta.namespace is None or meta.name is None:
        return
    key = (meta.namespace, meta.name)
    if _lifecycle(memo).due(key):
        await _drive(memo, key, kwargs)


def _owner(body: kopf.Body) -> str | None:
    owner = next(
        (ref for ref in body.metadata.get("ownerReferences", []) if ref.get("kind") == KIND),
        None,
    )
    return None if owner is None else str(owner["name"])


async def driver_changed(type: str | None, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """A driver StatefulSet changed: mirror its readiness, take the next lifecycle step."""
    if type == "DELETED":
        _context(memo).own_writes.forget(body)
    name, namespace = _owner(body), body.metadata.namespace
    if name is not None and namespace is not None:
        await _drive(memo, (namespace, name), kwargs)


async def driver_pod_changed(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """A driver pod changed (started, Ready, ended, gone): take the next lifecycle step."""
    name, namespace = body.metadata.labels.get(PIPELINE_LABEL), body.metadata.namespace
    if name is not None and namespace is not None:
        await _drive(memo, (namespace, name), kwargs, pod=plain(body))


async def child_changed(type: str | None, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """Another child was deleted or written: the lifecycle applies it again if out of sync.

    The echo of the operator's own apply changes nothing the lifecycle reads: no step.
    """
    if type == "DELETED":
        _context(memo).own_writes.forget(body)
    key = pipeline_key(body)
    if key is not None:
        await _drive(memo, key, kwargs)


async def health_daemon(
    body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, **kwargs: Any
) -> None:
    """Check one pipeline's health every ``spec.health.checkInterval`` until it is deleted."""
    health: HealthMonitor = memo.health
    await health.run(body, stopped, kwargs["children"])


async def finalize(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Honour the checkpoint retention policy before the garbage collector runs, valid or not.

    (kopf records a retried handler's attempts under its name: it stays ``finalize``.)
    """
    await honour_retention(_context(memo), body)


def register(registry: kopf.OperatorRegistry) -> None:
    """Register every handler of the operator on ``registry``."""
    pipeline = (GROUP, VERSION, PLURAL)
    kopf.on.login(registry=registry)(login)
    kopf.on.startup(registry=registry)(started)
    kopf.on.cleanup(registry=registry)(close)
    kopf.index(*pipeline, registry=registry)(pipelines)
    kopf.index(*pipeline, registry=registry)(pipeline_identities)
    kopf.index(*STATEFULSETS, labels=MANAGED, registry=registry)(driver_host_ports)
    for kind in WATCHED:
        labels = DRIVER_POD if kind == PODS else MANAGED
        kopf.index(*kind, labels=labels, registry=registry)(children)
    kopf.on.event(*pipeline, registry=registry)(pipeline_changed)
    kopf.timer(
        *pipeline,
        registry=registry,
        interval=TIMER_SECONDS,
        initial_delay=TIMER_SECONDS,
        backoff=RETRY_SECONDS,
    )(lifecycle_timer)
    kopf.on.event(*STATEFULSETS, labels=MANAGED, registry=registry)(driver_changed)
    kopf.on.event(*PODS, labels=DRIVER_POD, registry=registry)(driver_pod_changed)
    for kind in OTHER_CHILDREN:
        kopf.on.event(*kind, labels=MANAGED, registry=registry)(child_changed)
    kopf.daemon(*pipeline, registry=registry, cancellation_timeout=10.0)(health_daemon)
    kopf.on.delete(*pipeline, registry=registry)(finalize)
